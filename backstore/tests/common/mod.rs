//! Helpers shared by the integration tests: data patterns and root-only fixtures (loop devices,
//! small tmpfs mounts) that skip the test when they cannot be set up, or fail it in CI.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../src/test_support.rs"]
mod test_support;
pub use test_support::skip_or_fail;

/// Deterministic bytes that differ per `seed` and per position, so a misplaced block shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn run(cmd: &mut Command) -> Result<String, String> {
    match cmd.output() {
        Ok(out) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// A loop device over a backing file, detached on drop.
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attaches `backing`; `None` when losetup is unavailable or refuses, after
    /// [`skip_or_fail`] (the test then returns).
    pub fn attach(backing: &Path, sector_size: Option<u32>) -> Option<LoopDevice> {
        let mut cmd = Command::new("losetup");
        cmd.arg("--find").arg("--show");
        if let Some(s) = sector_size {
            cmd.arg("--sector-size").arg(s.to_string());
        }
        cmd.arg(backing);
        match run(&mut cmd) {
            Ok(dev) => Some(LoopDevice {
                path: PathBuf::from(dev),
            }),
            Err(e) => {
                skip_or_fail(format!(
                    "cannot set up a loop device (needs root and losetup): {e}"
                ));
                None
            }
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = run(Command::new("losetup").arg("--detach").arg(&self.path));
    }
}

/// A tmpfs of limited size mounted on a directory, unmounted on drop.
pub struct SmallTmpfs {
    pub dir: tempfile::TempDir,
}

impl SmallTmpfs {
    /// Mounts a tmpfs of `size`; `None` when it cannot, after [`skip_or_fail`] (the test then
    /// returns).
    pub fn mount(size: &str) -> Option<SmallTmpfs> {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let opts = format!("size={size}");
        match run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "rtgt-test"])
            .arg(dir.path()))
        {
            Ok(_) => Some(SmallTmpfs { dir }),
            Err(e) => {
                skip_or_fail(format!("cannot mount a tmpfs (needs root): {e}"));
                None
            }
        }
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let path = self.dir.path();
        for _ in 0..50 {
            if run(Command::new("umount").arg(path)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        eprintln!(
            "umount {} kept failing; detaching it lazily",
            path.display()
        );
        let _ = run(Command::new("umount").arg("--lazy").arg(path));
    }
}
