//! Helpers shared by the integration tests: prerequisites and a running rtgtd.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rtgt_tools::iscsi::{ScsiResult, Session};

/// Whether CI runs us (`CI` set, not empty, neither `false` nor `0`): there a missing
/// prerequisite is a failure, not a skip.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Reports that the calling test cannot run here because of `reason`: fails it in CI;
/// elsewhere writes `skipped: <test>: <reason>` to stderr (past the test harness's output
/// capture, so the skip shows) and the caller returns.
#[track_caller]
pub fn skip_or_fail(reason: impl Display) {
    let thread = std::thread::current();
    let test = thread.name().filter(|n| *n != "main").unwrap_or("test");
    assert!(
        !in_ci(),
        "{test}: {reason} (CI is set: a missing prerequisite is a failure)"
    );
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {reason}");
}

/// Runs `probe`; when it cannot start, [`skip_or_fail`] (the test then returns).
#[track_caller]
pub fn prerequisite(what: &str, probe: &[&str]) -> bool {
    let ok = Command::new(probe[0])
        .args(&probe[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        skip_or_fail(format!(
            "{what} is not installed (`{}` did not run)",
            probe.join(" ")
        ));
    }
    ok
}

pub const TEST_IQN: &str = "iqn.2025-01.io.rtgt:test";

/// A free TCP port on 127.0.0.1, taken from below the kernel's ephemeral port range. A port
/// from that range (what binding port 0 returns) can be given to any outgoing connection of a
/// test running in parallel between this check and rtgtd's bind, and a connection to it while
/// nothing listens can connect to itself: either way rtgtd then finds it in use.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    const LOW: u32 = 20000;
    if ephemeral > LOW + 1000 {
        let span = ephemeral - LOW;
        // Test processes of one run start at different places of the range.
        let start = std::process::id().wrapping_mul(7919);
        for _ in 0..span {
            let port = LOW + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// rtgtd running on 127.0.0.1 with its own state directory; stopped with SIGTERM on drop.
pub struct Rtgtd {
    pub child: Child,
    pub port: u16,
    pub dir: PathBuf,
    pub log: PathBuf,
}

impl Rtgtd {
    /// One target, LUN 0 on a sparse file of `size` bytes, any initiator admitted.
    pub fn start_file_lun(name: &str, size: u64) -> Rtgtd {
        let port = free_port();
        let config = format!(
            "backstores:\n  - {{name: lun0, type: file, path: lun0.img, size: {size}, block_size: 512}}\n\
             targets:\n  - name: {TEST_IQN}\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:{port}']\n        allow_any_initiator: true\n        luns: [{{lun: 0, backstore: lun0}}]\n"
        );
        Rtgtd::start(name, &config, port)
    }

    /// Starts rtgtd on `config` (YAML) and waits until `port` accepts connections.
    pub fn start(name: &str, config: &str, port: u16) -> Rtgtd {
        Rtgtd::start_with_files(name, config, port, &[])
    }

    /// Like [`Rtgtd::start`], with sparse files (name, size) created in the state directory
    /// first, for backstores rtgtd does not create (read-only ones).
    pub fn start_with_files(name: &str, config: &str, port: u16, files: &[(&str, u64)]) -> Rtgtd {
        Rtgtd::start_full(name, config, port, files, &[])
    }

    /// Like [`Rtgtd::start_with_files`], with extra environment variables for rtgtd.
    pub fn start_full(
        name: &str,
        config: &str,
        port: u16,
        files: &[(&str, u64)],
        env: &[(&str, &str)],
    ) -> Rtgtd {
        let dir = std::env::temp_dir().join(format!("rtgt-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the test state directory");
        for (file, size) in files {
            std::fs::File::create(dir.join(file))
                .and_then(|f| f.set_len(*size))
                .expect("create a backing file");
        }
        let cfg = dir.join("rtgt.yaml");
        // Tests run in parallel: only a test that asks for RDMA gets the soft-RoCE device,
        // so no two rtgtd (nor the transport's UDP tests) contend for UDP 4791.
        let config = if config.lines().any(|l| l.starts_with("rdma:")) {
            config.to_string()
        } else {
            format!("{config}rdma: {{enabled: false}}\n")
        };
        std::fs::write(&cfg, config).expect("write the test configuration");
        Rtgtd::spawn(&dir, &cfg, port, env)
    }

    fn spawn(dir: &Path, cfg: &Path, port: u16, env: &[(&str, &str)]) -> Rtgtd {
        let log = dir.join("rtgtd.log");
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the rtgtd log");
        let child = Command::new(env!("CARGO_BIN_EXE_rtgtd"))
            .arg("--config")
            .arg(cfg)
            .arg("--state-dir")
            .arg(dir)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdout(logf.try_clone().expect("clone the log handle"))
            .stderr(logf)
            .spawn()
            .expect("start rtgtd");
        let mut d = Rtgtd {
            child,
            port,
            dir: dir.to_path_buf(),
            log,
        };
        d.wait_listening();
        d
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            // A connection to itself (same local and peer address) is not rtgtd listening.
            if let Ok(s) = TcpStream::connect(("127.0.0.1", self.port)) {
                if s.local_addr().ok() != s.peer_addr().ok() {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("rtgtd exited with {status}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "rtgtd did not listen on port {} within 30 s:\n{}",
            self.port,
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn lun_url(&self, lun: u32) -> String {
        format!("iscsi://127.0.0.1:{}/{TEST_IQN}/{lun}", self.port)
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for Rtgtd {
    fn drop(&mut self) {
        if self.is_running() {
            self.stop();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("rtgtd state and log kept in {}", self.dir.display());
        }
    }
}

/// Runs a command, retrying after unit attentions as an initiator does; returns the
/// result and the unit attentions seen.
pub async fn run(
    s: &Session,
    lun: u64,
    cdb: &[u8],
    data: Option<Bytes>,
    len: u32,
    uas: &mut Vec<(u8, u8)>,
) -> ScsiResult {
    for _ in 0..8 {
        let r = s
            .command(lun, cdb, data.clone(), len)
            .await
            .expect("command");
        match r.sense_key() {
            Some((6, asc, ascq)) if r.status == 2 => uas.push((asc, ascq)),
            _ => return r,
        }
    }
    panic!("unit attentions do not stop");
}

/// rtgtctl (a binary of rtgt-api) next to rtgtd, built when missing.
pub fn rtgtctl_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_rtgtd")).with_file_name("rtgtctl");
    let built = Command::new(env!("CARGO"))
        .args(["build", "-q", "-p", "rtgt-api", "--bin", "rtgtctl"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(built.success(), "cannot build rtgtctl");
    bin
}

/// Runs rtgtctl against the API socket `socket`: whether it succeeded, its output and its
/// errors.
pub fn rtgtctl(socket: &Path, args: &[&str]) -> (bool, String, String) {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let out = Command::new(BIN.get_or_init(rtgtctl_bin))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run rtgtctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
