//! A one-node Ceph cluster for a test: `tests/ceph/cluster.sh` starts a monitor and a
//! memstore OSD on loopback in a scratch directory, with a pool `rbd`; dropping the
//! [`TestCluster`] stops them. A test that needs the cluster skips where it cannot start
//! (no Ceph daemons installed, not root), except in CI, where that fails it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The script, from this file's directory.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("tests/ceph/cluster.sh").exists())
        .expect("tests/ceph/cluster.sh in a parent of the crate")
        .join("tests/ceph/cluster.sh")
}

pub struct TestCluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    /// One cluster at a time per test process: each is a monitor and an OSD, and several
    /// starting at once on a small machine push each other past the script's time limits.
    _one: std::sync::MutexGuard<'static, ()>,
}

static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
type Guard = std::sync::MutexGuard<'static, ()>;

impl TestCluster {
    /// Starts a cluster, or says why it cannot (the caller skips or fails). A start that
    /// fails is tried once more in a new directory (on a loaded machine a port picked free
    /// may be taken before the daemon binds it); both failures are reported.
    pub fn start() -> Result<TestCluster, String> {
        if !Path::new("/usr/bin/ceph-osd").exists() || !Path::new("/usr/bin/ceph-mon").exists() {
            return Err("no Ceph daemons (Debian: ceph-mon ceph-osd ceph-common)".into());
        }
        let one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        TestCluster::start_once(one).or_else(|(first, one)| {
            TestCluster::start_once(one).map_err(|(second, _)| format!("{first}\nagain: {second}"))
        })
    }

    fn start_once(one: Guard) -> Result<TestCluster, (String, Guard)> {
        let dir = match tempfile::Builder::new().prefix("rtgt-ceph-").tempdir() {
            Ok(d) => d,
            Err(e) => return Err((e.to_string(), one)),
        };
        let out = match Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path().join("c"))
            .output()
        {
            Ok(o) => o,
            Err(e) => return Err((e.to_string(), one)),
        };
        if !out.status.success() {
            let why = format!(
                "the test cluster did not start: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Stop whatever the script left (it stops its daemons, but be sure).
            let _ = Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(dir.path().join("c"))
                .status();
            return Err((why, one));
        }
        let conf = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Ok(TestCluster {
            dir,
            conf,
            _one: one,
        })
    }

    /// The cluster's ceph.conf.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The scratch directory (the cluster's files are in `c` inside it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `rbd` against the cluster; panics with its output when it fails.
    pub fn rbd(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .expect("rbd runs");
        assert!(
            out.status.success(),
            "rbd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Creates image `name` of `mib` MiB in pool `rbd`.
    pub fn create_image(&self, name: &str, mib: u64) {
        self.rbd(&[
            "create",
            "--size",
            &format!("{mib}M"),
            &format!("rbd/{name}"),
        ]);
    }

    /// The whole image, as `rbd export` reads it.
    pub fn export(&self, name: &str) -> Vec<u8> {
        self.rbd(&["export", "--no-progress", &format!("rbd/{name}"), "-"])
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) the daemons: the cluster stops answering without
    /// any connection closing, as when it is out of reach.
    pub fn pause(&self, paused: bool) {
        let verb = if paused { "pause" } else { "resume" };
        let ok = Command::new("bash")
            .arg(script())
            .arg(verb)
            .arg(self.dir.path().join("c"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cluster.sh {verb}");
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path().join("c"))
            .status();
    }
}
