//! libiscsi's conformance suite (`iscsi-test-cu`) against rtgtd over TCP on 127.0.0.1.
//!
//! Every top-level suite of the ALL family runs on its own with a timeout, so a hanging suite
//! is reported as such instead of stalling the run; MultipathIO gets the LUN URL twice. The
//! totals are printed as `conformance: N passed, N failed, N skipped`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{prerequisite, Rtgtd};

/// Per-suite limit; the slowest suites finish in seconds.
const SUITE_TIMEOUT: Duration = Duration::from_secs(180);

/// The score rtgt must keep: no failures, and at least this many passes (of 229).
const MIN_PASSED: usize = 215;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
}

/// Reads CUnit's verbose output: `Test: NAME ...` opens a test and CUnit's own verdict closes
/// it, `passed` or `FAILED` at the start of the text that follows (libiscsi's log lines such as
/// `[FAILED] WRITE10 ...` are bracketed and are not verdicts); a passed test that printed
/// `[SKIPPED]` counts as skipped.
fn tally(output: &str) -> (Tally, Vec<String>) {
    let mut t = Tally::default();
    let mut failed = Vec::new();
    let mut current: Option<(String, bool)> = None;
    for line in output.lines() {
        let mut rest = line;
        if let Some(pos) = line.find("Test: ") {
            let after = &line[pos + 6..];
            let name = after.split(" ...").next().unwrap_or(after).to_string();
            current = Some((name, false));
            rest = after.split_once(" ...").map(|(_, r)| r).unwrap_or("");
        }
        let Some((name, skipped)) = current.as_mut() else {
            continue;
        };
        let verdict = rest.trim_start();
        if verdict.starts_with("FAILED") {
            t.failed += 1;
            failed.push(name.clone());
            current = None;
        } else if verdict.starts_with("passed") {
            if *skipped {
                t.skipped += 1;
            } else {
                t.passed += 1;
            }
            current = None;
        } else if rest.contains("[SKIPPED]") {
            *skipped = true;
        }
    }
    (t, failed)
}

fn suites() -> Vec<String> {
    let out = Command::new("iscsi-test-cu")
        .arg("-l")
        .output()
        .expect("iscsi-test-cu -l runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("ALL.") && l.matches('.').count() == 1)
        .map(str::to_string)
        .collect()
}

#[test]
fn tally_reads_cunit_output() {
    let out = "Suite: S\n  Test: A ...passed\n  Test: B ...    [SKIPPED] no\npassed\n  Test: C ...FAILED\n    1. x.c:1 - y\n  Test: D ...    [INFO] z\npassed    [FAILED] PRIN in the teardown\n  Test: E ...    [FAILED] WRITE10 as expected\npassed\n";
    let (t, failed) = tally(out);
    assert_eq!(
        t,
        Tally {
            passed: 3,
            failed: 1,
            skipped: 1
        }
    );
    assert_eq!(failed, vec!["C".to_string()]);
}

#[test]
fn libiscsi_conformance() {
    if !prerequisite("iscsi-test-cu", &["iscsi-test-cu", "-l"]) {
        return;
    }
    let mut daemon = Rtgtd::start_file_lun("conformance", 256 << 20);
    let url = daemon.lun_url(0);
    let mut total = Tally::default();
    let mut failures = Vec::new();
    let mut hung = Vec::new();
    for suite in suites() {
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=5")
            .arg(SUITE_TIMEOUT.as_secs().to_string())
            .args([
                "iscsi-test-cu",
                "--dataloss",
                "--allow-sanitize",
                "-t",
                &suite,
                &url,
                &url,
            ]);
        let out = cmd.output().expect("iscsi-test-cu runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let (t, failed) = tally(&text);
        if out.status.code() == Some(124) || out.status.code() == Some(137) {
            hung.push(suite.clone());
        }
        eprintln!(
            "conformance: {suite}: {} passed, {} failed, {} skipped{}",
            t.passed,
            t.failed,
            t.skipped,
            if failed.is_empty() {
                String::new()
            } else {
                format!(" ({})", failed.join(", "))
            }
        );
        if !failed.is_empty() {
            eprintln!("{text}");
        }
        failures.extend(failed.into_iter().map(|f| format!("{suite}.{f}")));
        total.passed += t.passed;
        total.failed += t.failed;
        total.skipped += t.skipped;
    }
    println!(
        "conformance: {} passed, {} failed, {} skipped",
        total.passed, total.failed, total.skipped
    );
    assert!(
        daemon.is_running(),
        "rtgtd exited during the conformance run"
    );
    assert!(hung.is_empty(), "suites timed out: {hung:?}");
    assert!(failures.is_empty(), "failed tests: {failures:?}");
    assert!(
        total.passed >= MIN_PASSED,
        "{} passed, fewer than {MIN_PASSED}",
        total.passed
    );
}
