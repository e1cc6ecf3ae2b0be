//! The `rtgt-rdma` pingpong tools against each other over UDP on 127.0.0.x (server on .7,
//! client on .8, port 4791, TCP exchange on a port of its own per test), payloads checked on
//! both ends. When port 4791 cannot be bound there (for example when rdma_rxe owns it in this
//! network namespace) the tests skip, or fail in CI.

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "../../transport/src/test_support.rs"]
mod test_support;
use test_support::skip_or_fail;

fn can_bind(ip: &str) -> std::io::Result<()> {
    let addr: SocketAddr = format!("{ip}:4791").parse().unwrap();
    UdpSocket::bind(addr).map(drop)
}

/// A server and a client of `mode` exchanging `size` bytes 50 times, with `chk` (`-c` or
/// `--chk`) on both ends. The client connects to `server_ip`; the server is given that
/// address with `--local` when `server_local`, and otherwise takes the one the client reached.
fn pingpong(
    mode: &str,
    (server_ip, server_local): (&str, bool),
    client_ip: &str,
    tcp_port: u16,
    size: u32,
    chk: &str,
) {
    if let Err(e) = can_bind(server_ip).and_then(|_| can_bind(client_ip)) {
        return skip_or_fail(format!(
            "cannot bind UDP 4791 on {server_ip} / {client_ip}: {e}"
        ));
    }
    let bin = env!("CARGO_BIN_EXE_rtgt-rdma");
    let common = |c: &mut Command| {
        c.args([
            &format!("{mode}-pingpong"),
            "-s",
            &size.to_string(),
            "-n",
            "50",
            "-p",
            &tcp_port.to_string(),
            chk,
            "--timeout",
            "30",
        ]);
    };
    let mut srv = Command::new(bin);
    common(&mut srv);
    srv.arg("--server");
    if server_local {
        srv.args(["--local", server_ip]);
    }
    let srv = srv
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    std::thread::sleep(Duration::from_millis(200));
    let mut cli = Command::new(bin);
    common(&mut cli);
    let cli = cli
        .args(["--local", client_ip, server_ip])
        .output()
        .expect("run the client");
    let srv = srv.wait_with_output().expect("wait for the server");
    for (who, out, local) in [("client", &cli, client_ip), ("server", &srv, server_ip)] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{who} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = format!("{} bytes in ", u64::from(size) * 50 * 2);
        assert!(stdout.contains(&want), "{who}: no result line in {stdout}");
        assert!(
            stdout.contains("payload check: 50 messages intact"),
            "{who}: payloads not checked: {stdout}"
        );
        let gid = format!("GID ::ffff:{local}");
        assert!(
            stdout
                .lines()
                .any(|l| l.contains("local address:") && l.ends_with(&gid)),
            "{who}: not on {local}: {stdout}"
        );
    }
}

#[test]
fn rc_pingpong_between_two_processes() {
    pingpong("rc", ("127.0.0.7", false), "127.0.0.8", 18611, 65536, "-c");
}

#[test]
fn ud_pingpong_between_two_processes() {
    pingpong(
        "ud",
        ("127.0.0.9", true),
        "127.0.0.10",
        18612,
        1024,
        "--chk",
    );
}

#[test]
fn bad_arguments_fail_cleanly() {
    let bin = env!("CARGO_BIN_EXE_rtgt-rdma");
    for args in [
        &["rc-pingpong", "--server", "-s", "0"][..],
        &["rc-pingpong", "--server", "-c", "--no-check"],
        &["rc-pingpong", "-m", "1000", "--local", "127.0.0.1"],
        &["ud-pingpong", "-s", "5000", "--local", "127.0.0.1"],
    ] {
        let out = Command::new(bin).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{args:?} panicked"
        );
    }
}
