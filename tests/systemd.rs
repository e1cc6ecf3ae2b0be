//! rtgtd as a systemd service: the notifications it sends a (fake) service manager, and the
//! unit file as systemd itself reads it.

mod common;

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, prerequisite, Rtgtd, TEST_IQN};

/// The next notification within `within`, or a failure naming what was awaited, with
/// rtgtd's log.
fn next(sock: &UnixDatagram, within: Duration, what: &str, rtgtd: &Rtgtd) -> String {
    sock.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        Err(e) => panic!(
            "no notification ({what}) within {within:?}: {e}\nrtgtd's log:\n{}",
            rtgtd.log_text()
        ),
    }
}

/// Waits for a notification that contains `line` as one of its assignments.
fn expect_line(sock: &UnixDatagram, line: &str, rtgtd: &Rtgtd) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {line} within 30 s:\n{}",
            rtgtd.log_text()
        );
        let msg = next(sock, left, line, rtgtd);
        if msg.lines().any(|l| l == line) {
            return msg;
        }
    }
}

#[test]
fn notifies_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    let port = free_port();
    let config = format!(
        "backstores:\n  - {{name: lun0, type: ramdisk, size: 1M}}\n\
         targets:\n  - name: {TEST_IQN}\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:{port}']\n        allow_any_initiator: true\n        luns: [{{lun: 0, backstore: lun0}}]\n"
    );
    let path_str = path.to_str().unwrap().to_owned();
    let mut rtgtd = Rtgtd::start_full(
        "sdnotify",
        &config,
        port,
        &[],
        &[
            ("NOTIFY_SOCKET", &path_str),
            // Keep-alives every 150 ms.
            ("WATCHDOG_USEC", "300000"),
        ],
    );
    let ready = expect_line(&sock, "READY=1", &rtgtd);
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=serving 1 targets")),
        "READY without a status: {ready:?}"
    );
    // Several keep-alives, so they are periodic and not a single message.
    for _ in 0..3 {
        expect_line(&sock, "WATCHDOG=1", &rtgtd);
    }
    // SIGHUP (systemctl reload) applies the edited file: a second portal starts listening.
    let port2 = free_port();
    let edited = config.replace(
        &format!("portals: ['127.0.0.1:{port}']"),
        &format!("portals: ['127.0.0.1:{port}', '127.0.0.1:{port2}']"),
    );
    assert_ne!(edited, config);
    std::fs::write(
        rtgtd.dir.join("rtgt.yaml"),
        format!("{edited}rdma: {{enabled: false}}\n"),
    )
    .unwrap();
    assert!(TcpStream::connect(("127.0.0.1", port2)).is_err());
    // SAFETY: kill(2) on the pid of a child we own and have not reaped.
    unsafe { libc::kill(rtgtd.child.id() as libc::pid_t, libc::SIGHUP) };
    let reloading = expect_line(&sock, "RELOADING=1", &rtgtd);
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "RELOADING without MONOTONIC_USEC: {reloading:?}"
    );
    expect_line(&sock, "READY=1", &rtgtd);
    assert!(
        rtgtd.is_running(),
        "SIGHUP ended rtgtd:\n{}",
        rtgtd.log_text()
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port2)).is_ok(),
        "the reloaded portal does not listen:\n{}",
        rtgtd.log_text()
    );
    // A file that does not validate changes nothing and rtgtd keeps serving.
    std::fs::write(
        rtgtd.dir.join("rtgt.yaml"),
        "targets: [{name: 'not an iqn'}]\n",
    )
    .unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(rtgtd.child.id() as libc::pid_t, libc::SIGHUP) };
    expect_line(&sock, "READY=1", &rtgtd);
    assert!(rtgtd.is_running());
    assert!(TcpStream::connect(("127.0.0.1", port2)).is_ok());
    assert!(
        rtgtd.log_text().contains("SIGHUP: configuration rejected"),
        "{}",
        rtgtd.log_text()
    );
    assert_eq!(rtgtd.stop(), Some(0), "{}", rtgtd.log_text());
    // Drain to the stop message: keep-alives sent before SIGTERM may still be queued.
    expect_line(&sock, "STOPPING=1", &rtgtd);
}

#[test]
fn watchdog_for_another_process_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    let port = free_port();
    let config = format!(
        "backstores:\n  - {{name: lun0, type: null, size: 1M}}\n\
         targets:\n  - name: {TEST_IQN}\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:{port}']\n        allow_any_initiator: true\n        luns: [{{lun: 0, backstore: lun0}}]\n"
    );
    let path_str = path.to_str().unwrap().to_owned();
    let mut rtgtd = Rtgtd::start_full(
        "sdnotify-pid",
        &config,
        port,
        &[],
        &[
            ("NOTIFY_SOCKET", &path_str),
            ("WATCHDOG_USEC", "100000"),
            ("WATCHDOG_PID", "1"),
        ],
    );
    expect_line(&sock, "READY=1", &rtgtd);
    // Half a second is five of the intervals a keep-alive would have used.
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 256];
    if let Ok(n) = sock.recv(&mut buf) {
        panic!(
            "unexpected notification {:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    assert_eq!(rtgtd.stop(), Some(0), "{}", rtgtd.log_text());
}

#[test]
fn unit_file_verifies() {
    if !prerequisite("systemd-analyze", &["systemd-analyze", "--version"]) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit = std::fs::read_to_string(root.join("deploy/rtgtd.service")).unwrap();
    assert!(
        unit.contains("\nType=notify\n"),
        "the unit is not Type=notify"
    );
    assert!(unit.contains("\nWatchdogSec="), "the unit sets no watchdog");
    // systemd checks that ExecStart's program exists: point it at the binary under test.
    let unit = unit.replace("/usr/bin/rtgtd", env!("CARGO_BIN_EXE_rtgtd"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rtgtd.service");
    std::fs::write(&file, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Without a running systemd (containers) verify still parses every directive; only
    // complaints about the unit itself count.
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("rtgtd.service"))
        .collect();
    assert!(
        out.status.success() && complaints.is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}
