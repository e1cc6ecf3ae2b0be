//! The Linux initiator lab as a libtest integration test: runs `lab/run.sh` (relative to the
//! manifest directory of the tests package) and asserts that every scenario passed.
//!
//! Without root, `qemu-system-x86_64` or `mmdebstrap` the test prints
//! `skipped: linux_initiator_lab: <reason>` and returns, unless `CI` is set (then a missing
//! prerequisite fails the test).
//! `RTGT_LAB_SCENARIOS` (space-separated names) selects scenarios; default: all of them.

use std::env;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../common/mod.rs"]
mod common;
use common::skip_or_fail;

/// A line on stderr that libtest's output capture does not swallow.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn on_path(tool: &str) -> bool {
    env::var_os("PATH")
        .map(|paths| env::split_paths(&paths).any(|dir| is_executable(&dir.join(tool))))
        .unwrap_or(false)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The effective user id, read from /proc/self/status (std has no geteuid).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn missing_prerequisite() -> Option<String> {
    match effective_uid() {
        Some(0) => {}
        Some(uid) => return Some(format!("needs root (running as uid {uid})")),
        None => return Some("cannot determine the user id".to_string()),
    }
    for tool in ["qemu-system-x86_64", "mmdebstrap", "ip", "tcpdump"] {
        if !on_path(tool) {
            return Some(format!(
                "{tool} is not installed (see tests/lab/host-packages.txt)"
            ));
        }
    }
    None
}

/// `lab/run.sh` next to the manifest of the package that runs this test (the tests directory),
/// or `tests/lab/run.sh` when the test is a target of another package of the workspace.
fn lab_script() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        manifest.join("lab/run.sh"),
        manifest.join("tests/lab/run.sh"),
        manifest.join("../tests/lab/run.sh"),
        manifest.join("../../tests/lab/run.sh"),
    ];
    match candidates.iter().find(|p| p.is_file()) {
        Some(path) => path.clone(),
        None => panic!("lab: run.sh not found (looked at {candidates:?})"),
    }
}

#[test]
fn linux_initiator_lab() {
    if let Some(reason) = missing_prerequisite() {
        return skip_or_fail(reason);
    }

    let script = lab_script();

    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    if std::env::var_os("RTGTD").is_none() {
        cmd.env("RTGTD", env!("CARGO_BIN_EXE_rtgtd"));
    }
    let selected: Vec<String> = env::var("RTGT_LAB_SCENARIOS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if selected.is_empty() {
        cmd.arg("--all");
    } else {
        cmd.args(&selected);
    }

    say(&format!("lab: running {cmd:?}"));
    let status = cmd.status().expect("lab: cannot start run.sh");
    assert!(
        status.success(),
        "lab: run.sh failed ({status}); see the results directory it printed"
    );
}
