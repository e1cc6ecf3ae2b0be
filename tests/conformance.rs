//! libiscsi's conformance suite (`iscsi-test-cu`) against rtgtd over TCP on 127.0.0.1.
//!
//! Every top-level suite of the ALL family runs on its own with a timeout, so a hanging suite
//! is reported as such instead of stalling the run; MultipathIO gets the LUN URL twice (two
//! sessions for the whole suite), the other suites open their second session when a test
//! needs one. Most suites run against LUN 0; those that need a logical unit configured for
//! them run against their own (see [`lun_for`]). The totals are printed as
//! `conformance: N passed, N failed, N skipped`.

#[path = "ceph/mod.rs"]
mod ceph;
mod common;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use common::{free_port, prerequisite, Rtgtd, TEST_IQN};

/// Per-suite limit; the slowest suites finish in seconds.
const SUITE_TIMEOUT: Duration = Duration::from_secs(180);

/// The score rtgt must keep: no failures, and at least this many passes (of 230).
const MIN_PASSED: usize = 230;

/// The logical units of the run.
///
/// - LUN 0: a 256 MiB thin file with 512-byte logical blocks and the default physical block
///   of 4096 bytes, for every suite not listed below.
/// - LUN 1: read-only (ReadOnly: every write-type command fails with WRITE PROTECTED).
/// - LUN 2: removable medium (PreventAllow, StartStopUnit, NoMedia eject and load it).
/// - LUN 3: like LUN 0 with a physical block of one logical block, for GetLBAStatus:
///   libiscsi 1.19's UnmapSingle expects, after unmapping `i` blocks at LBA 0, the first
///   descriptor for LBA `i + 1` to start at `i + LBPPB`, which holds only for LBPPB 1.
///
/// Target pings are off: libiscsi's tests sleep up to a minute without reading their
/// socket (Sanitize.Reset waits for the sanitize with `sleep(60)`), and a target that
/// drops unresponsive sessions would make them start over with a unit attention.
fn config(port: u16) -> String {
    format!(
        "\
backstores:
  - {{name: lun0, type: file, path: lun0.img, size: 256MiB, block_size: 512}}
  - {{name: ro, type: file, path: ro.img, size: 64MiB, read_only: true}}
  - {{name: removable, type: file, path: removable.img, size: 64MiB, removable: true}}
  - {{name: pbs512, type: file, path: pbs512.img, size: 256MiB, physical_block_size: 512}}
targets:
  - name: {TEST_IQN}
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:{port}']
        allow_any_initiator: true
        params: {{NopInInterval: 0}}
        luns:
          - {{lun: 0, backstore: lun0}}
          - {{lun: 1, backstore: ro}}
          - {{lun: 2, backstore: removable}}
          - {{lun: 3, backstore: pbs512}}
"
    )
}

/// The LUN a suite runs against (see [`config`]).
fn lun_for(suite: &str) -> u32 {
    match suite {
        "ALL.ReadOnly" => 1,
        "ALL.PreventAllow" | "ALL.StartStopUnit" | "ALL.NoMedia" => 2,
        "ALL.GetLBAStatus" => 3,
        _ => 0,
    }
}

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

impl Tally {
    /// Adds a suite's run; its failed tests go to `failures` as `SUITE.TEST`.
    fn add(&mut self, suite: &str, run: SuiteRun, failures: &mut Vec<String>) {
        failures.extend(run.failed.into_iter().map(|f| format!("{suite}.{f}")));
        self.passed += run.tally.passed;
        self.failed += run.tally.failed;
        self.skipped += run.tally.skipped;
    }

    /// The totals, past libtest's output capture.
    fn print(&self, what: &str) {
        let _ = writeln!(
            std::io::stderr(),
            "{what}: {} passed, {} failed, {} skipped",
            self.passed,
            self.failed,
            self.skipped
        );
    }
}

/// One suite's result.
struct SuiteRun {
    tally: Tally,
    failed: Vec<String>,
    hung: bool,
}

/// Runs one suite against `urls` (a second URL is the second path of the multipath tests and
/// the second initiator's session of the others), printing its score as `where` ran it.
fn run_suite(suite: &str, urls: &[String], place: &str) -> SuiteRun {
    let mut cmd = Command::new("timeout");
    cmd.arg("--kill-after=5")
        .arg(SUITE_TIMEOUT.as_secs().to_string())
        .args([
            "iscsi-test-cu",
            "--dataloss",
            "--allow-sanitize",
            "-t",
            suite,
        ])
        .args(urls);
    let out = cmd.output().expect("iscsi-test-cu runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let (tally, failed) = tally(&text);
    // Written past libtest's output capture so CI logs show the score of a passing run.
    let _ = writeln!(
        std::io::stderr(),
        "conformance: {suite} ({place}): {} passed, {} failed, {} skipped{}",
        tally.passed,
        tally.failed,
        tally.skipped,
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    );
    if !failed.is_empty() {
        eprintln!("{text}");
    }
    SuiteRun {
        tally,
        failed,
        hung: matches!(out.status.code(), Some(124 | 137)),
    }
}

#[test]
fn libiscsi_conformance() {
    if !prerequisite("iscsi-test-cu", &["iscsi-test-cu", "-l"]) {
        return;
    }
    let port = free_port();
    let mut daemon =
        Rtgtd::start_with_files("conformance", &config(port), port, &[("ro.img", 64 << 20)]);
    let mut total = Tally::default();
    let mut failures = Vec::new();
    let mut hung = Vec::new();
    for suite in suites() {
        let url = daemon.lun_url(lun_for(&suite));
        let mut urls = vec![url.clone()];
        if suite == "ALL.MultipathIO" {
            urls.push(url);
        }
        let run = run_suite(&suite, &urls, &format!("LUN {}", lun_for(&suite)));
        if run.hung {
            hung.push(suite.clone());
        }
        total.add(&suite, run, &mut failures);
    }
    total.print("conformance");
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

/// The persistent reservation suites with their two initiators on two rtgtd gateways of one
/// RBD image (tests/ceph/cluster.sh): each suite gets both gateways' URLs, so its second
/// session (libiscsi's multipath device) is on the other gateway, and every reservation
/// check crosses the gateways through the state kept in RADOS.
#[test]
fn pr_suites_across_two_rbd_gateways() {
    if !prerequisite("iscsi-test-cu", &["iscsi-test-cu", "-l"]) {
        return;
    }
    let cluster = match ceph::TestCluster::start() {
        Ok(c) => c,
        Err(e) => return common::skip_or_fail(e),
    };
    cluster.create_image("pr", 64);
    let gateway = |group: u16, port: u16| {
        let remote = 3 - group;
        format!(
            "\
backstores:
  - name: pr
    type: rbd
    wwn: 6001405aabbccdd0011223344556677e
    serial: rbdpr0001
    rbd: {{image: pr, ceph_conf: {conf}}}
targets:
  - name: {TEST_IQN}
    portal_groups:
      - {{tag: {group}, portals: ['127.0.0.1:{port}'], allow_any_initiator: true, alua_group: {group},
         luns: [{{lun: 0, backstore: pr}}], params: {{NopInInterval: 0}}}}
alua:
  groups:
    - {{id: {group}}}
    - {{id: {remote}, remote_ports: [{remote}]}}
policy: {{backstore_roots: ['{dir}']}}
",
            conf = cluster.conf().display(),
            dir = cluster.dir().display(),
        )
    };
    let (p1, p2) = (free_port(), free_port());
    let mut a = Rtgtd::start("conformance-gw1", &gateway(1, p1), p1);
    let mut b = Rtgtd::start("conformance-gw2", &gateway(2, p2), p2);
    let urls = [a.lun_url(0), b.lun_url(0)];
    let mut total = Tally::default();
    let mut failures = Vec::new();
    for suite in PR_SUITES {
        let run = run_suite(suite, &urls, "two rbd gateways");
        assert!(!run.hung, "{suite} timed out");
        total.add(suite, run, &mut failures);
    }
    total.print("conformance across two rbd gateways");
    assert!(a.is_running() && b.is_running(), "a gateway exited");
    assert!(failures.is_empty(), "failed tests: {failures:?}");
    assert!(
        total.passed >= PR_SUITES_MIN_PASSED,
        "{} passed",
        total.passed
    );
}

/// The reservation suites (persistent and SPC-2), run across two gateways.
const PR_SUITES: [&str; 8] = [
    "ALL.PrinReadKeys",
    "ALL.PrinServiceactionRange",
    "ALL.PrinReportCapabilities",
    "ALL.ProutRegister",
    "ALL.ProutReserve",
    "ALL.ProutClear",
    "ALL.ProutPreempt",
    "ALL.Reserve6",
];

/// What they must pass across two gateways: all of them.
const PR_SUITES_MIN_PASSED: usize = 27;
