//! The `rtgt-rdma` pingpong tools against each other over UDP on 127.0.0.x (server on .7,
//! client on .8, port 4791, TCP exchange on a port of its own per test). Skips when port 4791
//! cannot be bound there (for example when rdma_rxe owns it in this network namespace).

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

fn can_bind(ip: &str) -> bool {
    let addr: SocketAddr = format!("{ip}:4791").parse().unwrap();
    UdpSocket::bind(addr).is_ok()
}

fn pingpong(mode: &str, server_ip: &str, client_ip: &str, tcp_port: u16, size: u32) {
    if !can_bind(server_ip) || !can_bind(client_ip) {
        eprintln!("skipping: cannot bind UDP 4791 on {server_ip} / {client_ip}");
        return;
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
            "--no-check",
            "--timeout",
            "30",
        ]);
    };
    let mut srv = Command::new(bin);
    common(&mut srv);
    let srv = srv
        .args(["--server", "--local", server_ip])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    std::thread::sleep(Duration::from_millis(200));
    let mut cli = Command::new(bin);
    common(&mut cli);
    let cli = cli
        .args(["--local", client_ip, "127.0.0.1"])
        .output()
        .expect("run the client");
    let srv = srv.wait_with_output().expect("wait for the server");
    for (who, out) in [("client", &cli), ("server", &srv)] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{who} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = format!("{} bytes in ", u64::from(size) * 50 * 2);
        assert!(stdout.contains(&want), "{who}: no result line in {stdout}");
    }
}

#[test]
fn rc_pingpong_between_two_processes() {
    pingpong("rc", "127.0.0.7", "127.0.0.8", 18611, 65536);
}

#[test]
fn ud_pingpong_between_two_processes() {
    pingpong("ud", "127.0.0.9", "127.0.0.10", 18612, 1024);
}

#[test]
fn bad_arguments_fail_cleanly() {
    let bin = env!("CARGO_BIN_EXE_rtgt-rdma");
    for args in [
        &["rc-pingpong", "--server"][..],
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
