//! The administration API end to end against a running rtgtd: error answers, secrets,
//! the bearer token, persistence across kill -9, live LUN add / resize / ACL removal under
//! I/O from the in-repo initiator, portals, sessions, metrics, rtgtctl and schemathesis; SRP
//! target ports and sessions of iSCSI/TCP, iSER and SRP over soft-RoCE on loopback.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{free_port, prerequisite, rtgtctl_bin, run, skip_or_fail};
use rtgt_api::client::{segment, Client, ClientError};
use rtgt_api::config::Config;
use rtgt_api::{ChangeReport, SessionView};
use rtgt_tools::iscsi::{LoginConfig, ScsiResult, Session};

const TARGET: &str = "iqn.2025-01.io.rtgt:api";
const INI_A: &str = "iqn.2025-01.io.rtgt:host-a";
const INI_B: &str = "iqn.2025-01.io.rtgt:host-b";
const SECRET: &str = "chap-secret-never-shown";

/// rtgtd with its own state directory and API socket; killed on drop.
struct Daemon {
    child: Option<Child>,
    dir: PathBuf,
    config: PathBuf,
}

impl Daemon {
    fn start(name: &str, config: &str) -> Daemon {
        Daemon::start_with(name, config, &[])
    }

    /// Like [`Daemon::start`], with `files` (path in the state directory, contents) written
    /// first.
    fn start_with(name: &str, config: &str, files: &[(&str, String)]) -> Daemon {
        let dir = std::env::temp_dir().join(format!("rtgt-api-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (f, text) in files {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let file = dir.join("rtgt.yaml");
        std::fs::write(&file, config).unwrap();
        let mut d = Daemon {
            child: None,
            dir,
            config: file,
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("rtgtd.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rtgtd"))
            .arg("--config")
            .arg(&self.config)
            .arg("--state-dir")
            .arg(&self.dir)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start rtgtd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.client().request("GET", "/api/v1/ready", None, &[]) {
                if r.status == 200 {
                    return;
                }
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("rtgtd exited with {st}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "rtgtd not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn client(&self) -> Client {
        Client::unix(self.dir.join("rtgtd.sock"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("rtgtd.log")).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("rtgtd state and log kept in {}", self.dir.display());
        }
    }
}

fn base_config(port: u16, api: &str) -> String {
    format!(
        "\
backstores:
  - {{name: d0, type: file, path: d0.img, size: 16MiB}}
  - {{name: spare, type: ramdisk, size: 8MiB}}
targets:
  - name: {TARGET}
    portal_groups:
      - tag: 1
        portals: ['127.0.0.1:{port}']
        params: {{NopInInterval: 0}}
        luns: [{{lun: 0, backstore: d0}}]
        acls:
          - initiator: {INI_A}
          - initiator: {INI_B}
rdma: {{enabled: false}}
{api}"
    )
}

const NO_TCP_API: &str = "api: {listen: []}\n";

fn status_of(r: Result<serde_json::Value, ClientError>) -> (u16, Option<String>) {
    match r {
        Err(ClientError::Http { status, field, .. }) => (status, field),
        Ok(v) => panic!("expected an error, got {v}"),
        Err(e) => panic!("expected an HTTP error, got {e}"),
    }
}

fn tpg_path() -> String {
    format!("/api/v1/targets/{}/tpgs/1", segment(TARGET))
}

#[test]
fn errors_conflicts_and_not_found() {
    let d = Daemon::start("errors", &base_config(free_port(), NO_TCP_API));
    let c = d.client();
    assert_eq!(
        c.get::<serde_json::Value>("/api/v1/health").unwrap()["status"],
        "ok"
    );
    // 404: unknown route and unknown objects, as JSON.
    let r = c.request("GET", "/api/v1/nothing", None, &[]).unwrap();
    assert_eq!(r.status, 404);
    assert!(r.error().is_some(), "{}", r.text());
    assert_eq!(
        status_of(c.get("/api/v1/backstores/nope")).0,
        404,
        "unknown backstore"
    );
    assert_eq!(status_of(c.get("/api/v1/targets/iqn.2025-01.x:y")).0, 404);
    assert_eq!(status_of(c.get(&format!("{}/luns/7", tpg_path()))).0, 404);
    assert_eq!(
        c.request("DELETE", "/api/v1/sessions/iscsi-999", None, &[])
            .unwrap()
            .status,
        404
    );
    // 400: malformed path parameter and JSON.
    let r = c
        .request(
            "GET",
            &format!("/api/v1/targets/{}/tpgs/notanumber", segment(TARGET)),
            None,
            &[],
        )
        .unwrap();
    assert_eq!(r.status, 400);
    assert_eq!(r.error().unwrap().field.as_deref(), Some("tag"));
    let r = c
        .request(
            "POST",
            "/api/v1/backstores",
            Some("application/json"),
            b"{\"name\":",
        )
        .unwrap();
    assert_eq!(r.status, 400);
    // 415 and 413.
    let r = c
        .request("POST", "/api/v1/backstores", Some("text/plain"), b"x")
        .unwrap();
    assert_eq!(r.status, 415);
    let big = vec![b' '; 2 << 20];
    let r = c
        .request("PUT", "/api/v1/config", Some("application/yaml"), &big)
        .unwrap();
    assert_eq!(r.status, 413);
    // 422 naming the field.
    let bad = serde_json::json!({"name": "x", "type": "tape"});
    assert_eq!(
        status_of(c.send("POST", "/api/v1/backstores", &bad)),
        (422, Some("type".into()))
    );
    let bad = serde_json::json!({"name": "x", "type": "file", "path": "x.img", "size": "1MiB", "direct": "maybe"});
    assert_eq!(
        status_of(c.send("POST", "/api/v1/backstores", &bad)),
        (422, Some("direct".into()))
    );
    let bad = serde_json::json!({"name": "x", "type": "null", "size": "1MiB", "direct": true});
    assert_eq!(
        status_of(c.send("POST", "/api/v1/backstores", &bad)),
        (422, Some("direct".into()))
    );
    let bad = serde_json::json!({"name": "x", "type": "ramdisk", "size": 1000});
    assert_eq!(
        status_of(c.send("POST", "/api/v1/backstores", &bad)),
        (422, Some("size".into()))
    );
    let bad = serde_json::json!({"lun": 3, "backstore": "missing"});
    assert_eq!(
        status_of(c.send("POST", &format!("{}/luns", tpg_path()), &bad)),
        (422, Some("backstore".into()))
    );
    let bad = serde_json::json!({"initiator": "not-an-iqn"});
    assert_eq!(
        status_of(c.send("POST", &format!("{}/acls", tpg_path()), &bad)),
        (422, Some("initiator".into()))
    );
    // A file backstore the daemon cannot create is the client's problem, not a 5xx.
    let bad = serde_json::json!({"name": "x", "type": "file", "path": "nonexistent/dir/x.img", "size": "1M"});
    let (st, field) = status_of(c.send("POST", "/api/v1/backstores", &bad));
    assert_eq!(st, 422);
    assert!(field.unwrap().starts_with("backstores["));
    // 409: duplicates, LUN taken, backstore in use, last portal.
    let dup = serde_json::json!({"name": "d0", "type": "ramdisk", "size": "1M"});
    assert_eq!(
        status_of(c.send("POST", "/api/v1/backstores", &dup)),
        (409, Some("name".into()))
    );
    let taken = serde_json::json!({"lun": 0, "backstore": "spare"});
    assert_eq!(
        status_of(c.send("POST", &format!("{}/luns", tpg_path()), &taken)),
        (409, Some("lun".into()))
    );
    assert_eq!(
        status_of(
            c.delete("/api/v1/backstores/d0")
                .map(|_| serde_json::Value::Null)
        )
        .0,
        409
    );
    let dup = serde_json::json!({"initiator": INI_A});
    assert_eq!(
        status_of(c.send("POST", &format!("{}/acls", tpg_path()), &dup)).0,
        409
    );
    // Nothing of that changed the configuration.
    let cfg: Config = c.get("/api/v1/config").unwrap();
    assert_eq!(cfg.backstores.len(), 2);
    assert_eq!(cfg.targets[0].portal_groups[0].luns.len(), 1);
    // Deleting what is not in use works.
    c.delete("/api/v1/backstores/spare").unwrap();
    assert_eq!(status_of(c.get("/api/v1/backstores/spare")).0, 404);
    // The OpenAPI document is served.
    let doc: serde_json::Value = c.get("/api/v1/openapi.json").unwrap();
    assert!(doc["paths"]["/api/v1/backstores"]["post"].is_object());
    assert!(!d.log().contains("panicked"));
}

#[test]
fn secrets_are_write_only_and_apply_is_declarative() {
    let d = Daemon::start("secrets", &base_config(free_port(), NO_TCP_API));
    let c = d.client();
    let auth = serde_json::json!({"chap": {"user": "host-a", "secret": SECRET}});
    let shown = c
        .send("PUT", &format!("{}/acls/{}/auth", tpg_path(), INI_A), &auth)
        .unwrap();
    assert_eq!(shown["chap"]["secret"], "********");
    let acl: serde_json::Value = c.get(&format!("{}/acls/{}", tpg_path(), INI_A)).unwrap();
    assert_eq!(acl["auth"]["chap"]["user"], "host-a");
    assert_eq!(acl["auth"]["chap"]["secret"], "********");
    let export = c
        .request("GET", "/api/v1/config", None, &[])
        .unwrap()
        .text();
    assert!(!export.contains(SECRET), "{export}");
    let full = c
        .request("GET", "/api/v1/config?secrets=true", None, &[])
        .unwrap()
        .text();
    assert!(full.contains(SECRET));
    assert!(!d.log().contains(SECRET), "a secret reached the log");
    // The saved file keeps it (a restart needs it).
    assert!(std::fs::read_to_string(&d.config).unwrap().contains(SECRET));

    // Applying the redacted export changes nothing and keeps the secret.
    let redacted: Config = c.get("/api/v1/config").unwrap();
    let report = c.apply_yaml(&redacted.to_yaml()).unwrap();
    assert!(report.changes.is_empty(), "{report:?}");
    let full: Config = c.get("/api/v1/config?secrets=true").unwrap();
    let acl = &full.targets[0].portal_groups[0].acls[0];
    assert_eq!(acl.auth.chap.as_ref().unwrap().secret, SECRET);

    // A document with a new LUN and a removed ACL changes just that.
    let mut next = redacted.clone();
    next.backstores.push(rtgt_api::config::Backstore {
        name: "more".into(),
        kind: rtgt_api::config::BackstoreKind::Ramdisk,
        path: None,
        size: Some(rtgt_api::config::ByteSize(4 << 20)),
        block_size: 512,
        read_only: false,
        wwn: None,
        serial: None,
        thin: true,
        write_cache: true,
        direct: None,
        physical_block_size: None,
        removable: false,
        sanitize_rate: None,
        shared: None,
        rbd: None,
    });
    let g = &mut next.targets[0].portal_groups[0];
    g.luns.push(rtgt_api::config::Lun {
        lun: 5,
        backstore: "more".into(),
    });
    g.acls.retain(|a| a.initiator != INI_B);
    let report: ChangeReport = c.apply_yaml(&next.to_yaml()).unwrap();
    let seen: Vec<(String, String)> = report
        .changes
        .iter()
        .map(|c| (c.action.clone(), c.object.clone()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("added".into(), "backstore".into()),
            ("added".into(), "lun".into()),
            ("removed".into(), "acl".into()),
        ],
        "{report:?}"
    );
    // JSON documents are accepted too, and a bad one names its field.
    let r = c
        .request(
            "PUT",
            "/api/v1/config",
            Some("application/json"),
            br#"{"backstores": [{"name": "a", "type": "null", "sise": 1}]}"#,
        )
        .unwrap();
    assert_eq!(r.status, 422);
    assert_eq!(
        r.error().unwrap().field.as_deref(),
        Some("backstores[0].sise")
    );
    let r = c
        .request(
            "PUT",
            "/api/v1/config",
            Some("application/yaml"),
            b"targets:\n  - name: iqn.2025-01.io.rtgt:x\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:1']\n        luns: [{lun: 0, backstore: nope}]\n",
        )
        .unwrap();
    assert_eq!(r.status, 422);
    assert_eq!(r.error().unwrap().field.as_deref(), Some("backstore"));
}

#[test]
fn every_tcp_listener_takes_a_token() {
    let (lo, any, metrics) = (free_port(), free_port(), free_port());
    let api = format!(
        "api:\n  listen: ['127.0.0.1:{lo}', '0.0.0.0:{any}']\n  metrics_listen: ['127.0.0.1:{metrics}']\n"
    );
    let d = Daemon::start("token", &base_config(free_port(), &api));
    let read_token = |name: &str| {
        let file = d.dir.join(name);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
        std::fs::read_to_string(&file).unwrap().trim().to_string()
    };
    let (admin, reader) = (read_token("api-token"), read_token("api-token-read"));
    assert_ne!(admin, reader);
    let at = |port: u16, t: Option<&str>| {
        Client::url(&format!("http://127.0.0.1:{port}"))
            .unwrap()
            .with_token(t.map(str::to_string))
    };
    let status = |c: Client, method: &str, path: &str| c.request(method, path, None, &[]).unwrap();
    let put = |c: &Config| {
        at(lo, Some(&admin))
            .request(
                "PUT",
                "/api/v1/config",
                Some("application/json"),
                &serde_json::to_vec(c).unwrap(),
            )
            .unwrap()
    };
    for port in [lo, any] {
        // Loopback is no exception: no token, a wrong one, or another scheme is a 401.
        for t in [None, Some("0123456789abcdef0123"), Some(&admin[1..])] {
            let r = status(at(port, t), "GET", "/api/v1/config");
            assert_eq!(r.status, 401, "{port} {t:?}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer realm=\"rtgt\""));
        }
        // Another scheme with the right secret is no token either.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "GET /api/v1/config HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {admin}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert_eq!(status(at(port, None), "GET", "/metrics").status, 401);
        assert_eq!(status(at(port, None), "GET", "/api/v1/health").status, 200);
        let r = status(at(port, None), "DELETE", "/api/v1/backstores/spare");
        assert_eq!(r.status, 401);
        // The read-only token reads, without secrets, and changes nothing.
        assert_eq!(
            status(at(port, Some(&reader)), "GET", "/api/v1/config").status,
            200
        );
        assert_eq!(
            status(at(port, Some(&reader)), "GET", "/metrics").status,
            200
        );
        assert_eq!(
            status(at(port, Some(&reader)), "GET", "/api/v1/sessions").status,
            200
        );
        let r = status(
            at(port, Some(&reader)),
            "GET",
            "/api/v1/config?secrets=true",
        );
        assert_eq!(r.status, 403);
        let r = status(
            at(port, Some(&reader)),
            "DELETE",
            "/api/v1/backstores/spare",
        );
        assert_eq!(r.status, 403);
        assert!(r.text().contains("read-only"), "{}", r.text());
        // The admin token does everything.
        let r = status(at(port, Some(&admin)), "GET", "/api/v1/config?secrets=true");
        assert_eq!(r.status, 200);
    }
    // Nothing was deleted by the refused requests.
    let cfg: Config = d.client().get("/api/v1/config").unwrap();
    assert_eq!(cfg.backstores.len(), 2);
    // The metrics listener serves /metrics to anyone, and nothing else.
    assert_eq!(status(at(metrics, None), "GET", "/metrics").status, 200);
    assert_eq!(
        status(at(metrics, None), "GET", "/api/v1/config").status,
        404
    );
    assert_eq!(
        status(at(metrics, None), "DELETE", "/api/v1/backstores/spare").status,
        404
    );
    // The API cannot change who may reach it or what it may open.
    let mut c: Config = at(lo, Some(&admin)).get("/api/v1/config").unwrap();
    c.api.listen.push("0.0.0.0:1".parse().unwrap());
    let r = put(&c);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error().unwrap().field.as_deref(), Some("api"));
    c.api = Default::default();
    c.policy.backstore_roots.push("/".into());
    let r = put(&c);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error().unwrap().field.as_deref(), Some("policy"));
    // A document without the sections keeps them.
    c.policy = Default::default();
    let r = put(&c);
    assert_eq!(r.status, 200, "{}", r.text());
    let after: Config = d.client().get("/api/v1/config").unwrap();
    assert_eq!(after.api.metrics_listen.len(), 1);
    // Changes are logged with who made them; tokens never are.
    let log = d.log();
    assert!(log.contains("admin token from 127.0.0.1"), "{log}");
    assert!(!log.contains(&admin) && !log.contains(&reader));
}

/// The state after `k` steps of the burst in [`kill9_during_a_burst_keeps_an_acknowledged_state`].
fn burst_state(base: &Config, k: usize) -> Config {
    let mut c = base.clone();
    for i in 0..k {
        c.backstores.push(rtgt_api::config::Backstore {
            name: format!("b{i}"),
            kind: rtgt_api::config::BackstoreKind::Null,
            path: None,
            size: Some(rtgt_api::config::ByteSize(1 << 20)),
            block_size: 512,
            read_only: false,
            wwn: None,
            serial: None,
            thin: true,
            write_cache: true,
            direct: None,
            physical_block_size: None,
            removable: false,
            sanitize_rate: None,
            shared: None,
            rbd: None,
        });
        c.targets[0].portal_groups[0]
            .luns
            .push(rtgt_api::config::Lun {
                lun: 100 + i as u64,
                backstore: format!("b{i}"),
            });
    }
    c
}

#[test]
fn kill9_during_a_burst_keeps_an_acknowledged_state() {
    let mut d = Daemon::start("persist", &base_config(free_port(), NO_TCP_API));
    let c = d.client();
    let base: Config = c.get("/api/v1/config?secrets=true").unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let burst = {
        let (c, acked, stop, base) = (c.clone(), acked.clone(), stop.clone(), base.clone());
        std::thread::spawn(move || {
            // Each step is one whole-document apply: a backstore and its LUN together.
            for k in 1..=200 {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                match c.apply_yaml(&burst_state(&base, k).to_yaml()) {
                    Ok(_) => acked.store(k as u64, Ordering::Release),
                    Err(_) => break,
                }
            }
        })
    };
    // Let some changes land, then kill without warning.
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::Acquire) < 5 {
        assert!(
            !burst.is_finished(),
            "the burst stopped early:\n{}",
            d.log()
        );
        assert!(Instant::now() < deadline, "changes are not acknowledged");
        std::thread::sleep(Duration::from_millis(5));
    }
    d.kill9();
    stop.store(true, Ordering::Release);
    burst.join().unwrap();
    let acked_then = acked.load(Ordering::Acquire) as usize;
    // The file is whole, and is the last acknowledged state or the one in flight.
    let on_disk = Config::load(&d.config).expect("the saved configuration loads");
    let k = on_disk.backstores.len() - base.backstores.len();
    assert!(
        k == acked_then || k == acked_then + 1,
        "saved state {k}, acknowledged {acked_then}"
    );
    assert_eq!(on_disk, burst_state(&base, k));
    // A restart serves it.
    d.spawn();
    let restored: Config = d.client().get("/api/v1/config?secrets=true").unwrap();
    assert_eq!(restored, burst_state(&base, k));
    let leftovers: Vec<_> = std::fs::read_dir(&d.dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.len() <= 1);
}

/// Whether the file system of `dir` serves O_DIRECT opens (tmpfs, for one, only emulates it
/// and rtgtd does not use it there).
fn o_direct_supported(dir: &Path) -> bool {
    let probe = dir.join(".o_direct_probe");
    std::fs::write(&probe, b"").unwrap();
    let tmpfs = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&probe)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs")
        .unwrap_or(false);
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    opened && !tmpfs
}

fn login(port: u16, initiator: &str, isid: u8) -> LoginConfig {
    let _ = port;
    LoginConfig {
        initiator_name: initiator.into(),
        isid: [0x80, 0, 0, 0, 0, isid],
        target_name: Some(TARGET.into()),
        ..LoginConfig::default()
    }
}

fn read_capacity16(r: &ScsiResult) -> (u64, u32) {
    let d = &r.data;
    (
        u64::from_be_bytes(d[0..8].try_into().unwrap()) + 1,
        u32::from_be_bytes(d[8..12].try_into().unwrap()),
    )
}

const READ_CAPACITY16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
const REPORT_LUNS: [u8; 12] = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];

#[test]
fn live_changes_under_io() {
    let port = free_port();
    let d = Daemon::start("live", &base_config(port, NO_TCP_API));
    let c = d.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let (a, b) = rt.block_on(async {
        (
            Session::connect(addr, login(port, INI_A, 1)).await.unwrap(),
            Session::connect(addr, login(port, INI_B, 2)).await.unwrap(),
        )
    });
    let a = Arc::new(a);
    let stop = Arc::new(AtomicBool::new(false));
    let ios = Arc::new(AtomicU64::new(0));
    // Writer: write a pattern, read it back, compare, over and over on LUN 0.
    let io = {
        let (a, stop, ios) = (a.clone(), stop.clone(), ios.clone());
        rt.spawn(async move {
            let mut uas = Vec::new();
            let mut i: u32 = 0;
            while !stop.load(Ordering::Acquire) {
                let lba = (i % 4096) * 8;
                let pattern: Vec<u8> = (0..4096u32).map(|x| (x ^ i) as u8).collect();
                let mut w = [0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
                w[2..6].copy_from_slice(&lba.to_be_bytes());
                let r = run(&a, 0, &w, Some(Bytes::from(pattern.clone())), 0, &mut uas).await;
                assert!(r.is_good(), "WRITE failed during live changes: {r:?}");
                let mut rd = w;
                rd[0] = 0x28;
                let r = run(&a, 0, &rd, None, 4096, &mut uas).await;
                assert!(r.is_good(), "READ failed during live changes: {r:?}");
                assert_eq!(r.data, pattern, "data mismatch at LBA {lba}");
                ios.fetch_add(1, Ordering::Relaxed);
                i = i.wrapping_add(1);
            }
            uas
        })
    };
    let wait_ios = |n: u64, io: &tokio::task::JoinHandle<Vec<(u8, u8)>>| {
        let start = ios.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(60);
        while ios.load(Ordering::Relaxed) < start + n {
            assert!(!io.is_finished(), "the I/O task ended early");
            assert!(Instant::now() < deadline, "I/O does not progress");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait_ios(20, &io);
    // Add LUN 1.
    c.send(
        "POST",
        &format!("{}/luns", tpg_path()),
        &serde_json::json!({"lun": 1, "backstore": "spare"}),
    )
    .unwrap();
    wait_ios(20, &io);
    // Remove the other initiator's ACL: only its session ends.
    c.delete(&format!("{}/acls/{}", tpg_path(), INI_B)).unwrap();
    wait_ios(20, &io);
    // Grow LUN 0.
    let mut bs: serde_json::Value = c.get("/api/v1/backstores/d0").unwrap();
    bs["size"] = serde_json::json!("32MiB");
    let back = c.send("PUT", "/api/v1/backstores/d0", &bs).unwrap();
    assert_eq!(back["size"], "32MiB");
    assert_eq!(
        back["direct"], false,
        "a file serves through the page cache"
    );
    wait_ios(20, &io);
    // Switch its cache modes back and forth under the writer: O_DIRECT, no write cache,
    // then back. No command fails, every read returns what was written.
    let o_direct = o_direct_supported(&d.dir);
    for (direct, write_cache) in [(true, true), (true, false), (false, false), (false, true)] {
        let mut bs: serde_json::Value = c.get("/api/v1/backstores/d0").unwrap();
        bs["direct"] = direct.into();
        bs["write_cache"] = write_cache.into();
        let back = c.send("PUT", "/api/v1/backstores/d0", &bs).unwrap();
        assert_eq!(
            (back["direct"].clone(), back["write_cache"].clone()),
            (direct.into(), write_cache.into())
        );
        let metrics = c.get_text("/metrics").unwrap();
        let lun_direct = u8::from(direct && o_direct);
        assert!(
            metrics.contains(&format!(
                "rtgt_lun_direct{{backstore=\"d0\"}} {lun_direct}\n"
            )),
            "{metrics}"
        );
        assert!(metrics.contains(&format!(
            "rtgt_lun_write_cache{{backstore=\"d0\"}} {}\n",
            u8::from(write_cache)
        )));
        wait_ios(20, &io);
        if !write_cache {
            let mode_sense = [0x5a, 0x08, 0x08, 0, 0, 0, 0, 0, 64, 0];
            let r = rt.block_on(async { run(&a, 0, &mode_sense, None, 64, &mut Vec::new()).await });
            assert!(r.is_good() && r.data[8] & 0x3f == 0x08, "{r:?}");
            assert_eq!(r.data[10] & 0x04, 0, "WCE is 0 once write_cache is off");
        }
    }
    stop.store(true, Ordering::Release);
    let uas = rt.block_on(io).expect("the I/O task did not fail");
    assert!(
        uas.contains(&(0x2a, 0x01)),
        "MODE PARAMETERS CHANGED: {uas:?}"
    );
    assert!(
        uas.contains(&(0x3f, 0x0e)),
        "REPORTED LUNS DATA HAS CHANGED: {uas:?}"
    );
    assert!(
        uas.contains(&(0x2a, 0x09)),
        "CAPACITY DATA HAS CHANGED: {uas:?}"
    );
    rt.block_on(async {
        let mut uas = Vec::new();
        let r = run(&a, 0, &REPORT_LUNS, None, 256, &mut uas).await;
        assert!(r.is_good());
        assert_eq!(&r.data[0..4], &16u32.to_be_bytes(), "two LUNs reported");
        assert_eq!(&r.data[16..18], &[0, 1]);
        let r = run(&a, 0, &READ_CAPACITY16, None, 32, &mut uas).await;
        assert_eq!(read_capacity16(&r), (32 << 20 >> 9, 512));
        let r = run(&a, 1, &READ_CAPACITY16, None, 32, &mut uas).await;
        assert_eq!(read_capacity16(&r), (8 << 20 >> 9, 512));
        // B's session was ended by the target.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !b.is_closed() && b.nop(b"x").await.is_ok() {
            assert!(Instant::now() < deadline, "B's session is still open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // And B cannot log in again.
        assert!(Session::connect(addr, login(port, INI_B, 3)).await.is_err());
        // A task management function of A's (ABORT TASK of a task that never existed).
        let r = a
            .task_management(1, 0, 0x7777_7777, 0x8000_0000)
            .await
            .unwrap();
        assert_eq!(r, 1, "TASK DOES NOT EXIST");
    });

    // Sessions: A is listed with its counters; metrics count its commands.
    let sessions: Vec<SessionView> = c.get("/api/v1/sessions").unwrap();
    let sa = sessions
        .iter()
        .find(|s| s.initiator == INI_A)
        .expect("A's session is listed");
    assert_eq!(sa.transport, "tcp");
    assert_eq!(sa.target, TARGET);
    assert!(sa.commands > 0 && sa.queue_depth > 0);
    assert_eq!(sa.task_management, 1);
    assert!(!sessions.iter().any(|s| s.initiator == INI_B));
    let metrics = c.get_text("/metrics").unwrap();
    let value = |line_start: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line_start} missing from\n{metrics}"))
    };
    assert!(value("rtgt_lun_commands_total{backstore=\"d0\",class=\"write\"}") >= 80.0);
    assert!(value("rtgt_lun_written_bytes_total{backstore=\"d0\"}") >= 80.0 * 4096.0);
    assert!(
        value(&format!(
            "rtgt_session_commands_total{{session=\"{}\"",
            sa.id
        )) >= 1.0
    );
    assert!(value("rtgt_lun_errors_total{backstore=\"d0\",sense_key=\"unit_attention\"}") >= 2.0);
    assert!(metrics.contains("rtgt_lun_latency_seconds_bucket{backstore=\"d0\",class=\"read\""));
    assert_eq!(value("rtgt_sessions{transport=\"tcp\"}"), 1.0);
    assert_eq!(
        value(&format!("rtgt_session_queue_depth{{session=\"{}\"", sa.id)),
        f64::from(sa.queue_depth)
    );
    assert_eq!(
        value(&format!(
            "rtgt_session_task_management_total{{session=\"{}\"",
            sa.id
        )),
        1.0
    );
    assert_eq!(
        value("rtgt_lun_capacity_bytes{backstore=\"d0\"}"),
        (32u64 << 20) as f64
    );

    // Force logout.
    c.delete(&format!("/api/v1/sessions/{}", sa.id)).unwrap();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !a.is_closed() && a.nop(b"x").await.is_ok() {
            assert!(Instant::now() < deadline, "A's session is still open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert!(!d.log().contains("panicked"));
}

#[test]
fn portals_start_and_stop_live() {
    let d = Daemon::start("portals", &base_config(free_port(), NO_TCP_API));
    let c = d.client();
    let extra = free_port();
    let addr = format!("127.0.0.1:{extra}");
    c.send(
        "POST",
        &format!("{}/portals", tpg_path()),
        &serde_json::json!({"address": addr}),
    )
    .unwrap();
    assert!(TcpStream::connect(&addr).is_ok(), "the new portal listens");
    let r = c
        .send(
            "POST",
            &format!("{}/portals", tpg_path()),
            &serde_json::json!({"address": addr}),
        )
        .map(|_| serde_json::Value::Null);
    assert_eq!(status_of(r).0, 409);
    c.delete(&format!("{}/portals/{}", tpg_path(), segment(&addr)))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(&addr).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the removed portal still listens"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A portal on an address in use is a conflict, not a server error.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let r = c
        .send(
            "POST",
            &format!("{}/portals", tpg_path()),
            &serde_json::json!({"address": busy.local_addr().unwrap().to_string()}),
        )
        .map(|_| serde_json::Value::Null);
    assert_eq!(status_of(r).0, 409);
    let r = c.request("GET", "/api/v1/ready", None, &[]).unwrap();
    assert_eq!(r.status, 200);
}

/// The soft-RoCE address rtgtd serves iSER and SRP on in [`rdma_transports_live`], and the
/// one its initiators use: loopback addresses of their own, so another rtgtd on the host
/// (UDP 4791 of 127.0.0.1) does not take them.
const RDMA_TARGET: [u8; 4] = [127, 0, 0, 41];
const RDMA_INITIATOR: [u8; 4] = [127, 0, 0, 42];
const SRP_ID_EXT: u64 = 0x0002_c903_00ab_0001;
const SRP_IOC_GUID: u64 = 0x0002_c903_00ab_0002;
const SRP_INI_A: [u8; 16] = [0xa1; 16];
const SRP_INI_B: [u8; 16] = [0xb2; 16];

fn srp_name(id: &[u8; 16]) -> String {
    id.iter()
        .fold("0x".to_string(), |s, b| s + &format!("{b:02x}"))
}

/// An SRP command with its unit attentions taken as an initiator does; returns the
/// answer and the (ASC, ASCQ) of the unit attentions seen.
async fn srp_run(
    ini: &rtgt_tools::srp::Initiator,
    lun: u64,
    cdb: &[u8],
    len: u32,
    uas: &mut Vec<(u8, u8)>,
) -> rtgt_tools::srp::Reply {
    use rtgt_tools::srp::DescMode;
    for _ in 0..8 {
        let r = ini
            .command(lun, cdb, None, len, DescMode::Direct)
            .await
            .expect("SRP command");
        let s = &r.rsp.sense;
        if r.rsp.status == 2 && s.len() >= 14 && s[2] & 0x0f == 6 {
            uas.push((s[12], s[13]));
            continue;
        }
        return r;
    }
    panic!("unit attentions do not stop");
}

fn sessions_of(c: &Client, transport: &str) -> Vec<SessionView> {
    let all: Vec<SessionView> = c.get("/api/v1/sessions").unwrap();
    all.into_iter()
        .filter(|s| s.transport == transport)
        .collect()
}

/// Polls `f` until it holds (bounded).
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// iSER and SRP through the API against a rtgtd serving them on soft-RoCE: SRP target ports
/// created, given LUNs and ACLs live; sessions of all three transports listed with their
/// transport, queue depth and counters, and forced out; iSER listeners following portal
/// changes; per-session metrics with their transport.
#[test]
fn rdma_transports_live() {
    use rtgt_tools::srp::{ConnectOptions, Initiator, InitiatorError};
    use rtgt_transport::hca::{Hca, HcaConfig};

    let tcp = free_port();
    let target_ip = std::net::Ipv4Addr::from(RDMA_TARGET);
    let config = base_config(tcp, NO_TCP_API)
        .replace("127.0.0.1", &target_ip.to_string())
        .replace(
            "rdma: {enabled: false}",
            &format!("rdma: {{addresses: [{target_ip}]}}"),
        );
    let d = Daemon::start("rdma", &config);
    if !d.log().contains("RDMA device ready") {
        return skip_or_fail(format!(
            "rtgtd could not bring up its RDMA device on {target_ip} (UDP 4791 taken?):\n{}",
            d.log()
        ));
    }
    let c = d.client();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut hc = HcaConfig::new(vec![std::net::IpAddr::from(RDMA_INITIATOR)]);
    hc.name = "rtgt-api-test".into();
    let hca = rt
        .block_on(async { Hca::open(&hc) })
        .expect("initiator RDMA device");
    let pd = hca.device().alloc_pd().unwrap();
    let tcp_addr: std::net::SocketAddr = format!("{target_ip}:{tcp}").parse().unwrap();

    // An iSCSI/TCP session and an iSER one: the list tells them apart.
    let tcp_s = rt
        .block_on(Session::connect(tcp_addr, login(tcp, INI_A, 1)))
        .unwrap();
    let iser_s = rt
        .block_on(Session::connect_iser_cm(
            hca.cm(),
            &pd,
            tcp_addr,
            login(tcp, INI_B, 2),
        ))
        .expect("iSER login");
    let mut uas = Vec::new();
    rt.block_on(async {
        assert!(run(&tcp_s, 0, &READ_CAPACITY16, None, 32, &mut uas)
            .await
            .is_good());
        assert!(run(&iser_s, 0, &READ_CAPACITY16, None, 32, &mut uas)
            .await
            .is_good());
    });
    let tcp_v = sessions_of(&c, "tcp");
    let iser_v = sessions_of(&c, "iser");
    assert_eq!(tcp_v.len(), 1, "{tcp_v:?}");
    assert_eq!(iser_v.len(), 1, "{iser_v:?}");
    assert_eq!(iser_v[0].initiator, INI_B);
    assert!(iser_v[0].queue_depth > 0 && iser_v[0].commands >= 1);

    // The provider and the device of each address and listener, in the API and the metrics.
    let view: rtgt_api::RdmaView = c.get("/api/v1/rdma").unwrap();
    assert_eq!(view.provider, "soft", "{view:?}");
    let device = view
        .devices
        .iter()
        .find(|d| d.address == target_ip.to_string())
        .map(|d| d.device.clone())
        .unwrap_or_else(|| panic!("{target_ip} not served: {view:?}"));
    assert!(
        view.listeners
            .iter()
            .any(|l| l.fabric == "iser" && l.address == tcp_addr.to_string() && l.device == device),
        "{view:?}"
    );
    let metrics = c.get_text("/metrics").unwrap();
    let series = format!(
        "rtgt_rdma_listener_info{{fabric=\"iser\",address=\"{tcp_addr}\",provider=\"soft\",device=\"{device}\"}} 1"
    );
    assert!(metrics.contains(&series), "no {series} in\n{metrics}");

    // iSER listeners follow the portals: a new portal serves iSER at once, a removed one
    // stops, and turning iSER off and on in the group stops and starts its listeners while
    // the iSER session already running is untouched.
    let extra: std::net::SocketAddr = format!("{target_ip}:{}", free_port()).parse().unwrap();
    let iser_login = |addr, isid| {
        rt.block_on(Session::connect_iser_cm(
            hca.cm(),
            &pd,
            addr,
            login(tcp, INI_A, isid),
        ))
    };
    assert!(iser_login(extra, 3).is_err(), "no iSER listener yet");
    c.send(
        "POST",
        &format!("{}/portals", tpg_path()),
        &serde_json::json!({"address": extra.to_string()}),
    )
    .unwrap();
    let s = iser_login(extra, 4).expect("iSER on the added portal");
    rt.block_on(s.logout()).unwrap();
    let mut g: serde_json::Value = c.get(&tpg_path()).unwrap();
    g["iser"] = serde_json::json!(false);
    c.send("PUT", &tpg_path(), &g).unwrap();
    assert!(iser_login(extra, 5).is_err(), "iSER turned off");
    assert!(iser_login(tcp_addr, 6).is_err(), "iSER turned off");
    rt.block_on(async {
        assert!(run(&iser_s, 0, &READ_CAPACITY16, None, 32, &mut uas)
            .await
            .is_good());
    });
    g["iser"] = serde_json::json!(true);
    c.send("PUT", &tpg_path(), &g).unwrap();
    let s = iser_login(extra, 7).expect("iSER turned on again");
    rt.block_on(s.logout()).unwrap();
    c.delete(&format!(
        "{}/portals/{}",
        tpg_path(),
        segment(&extra.to_string())
    ))
    .unwrap();
    assert!(iser_login(extra, 8).is_err(), "iSER portal removed");

    // An SRP target port made through the API serves at once.
    let srp_addr: std::net::SocketAddr = format!("{target_ip}:{}", free_port()).parse().unwrap();
    let ports = "/api/v1/srp/ports";
    let port = serde_json::json!({
        "name": "srp1",
        "listen": [srp_addr.to_string()],
        "id_ext": format!("{SRP_ID_EXT:016x}"),
        "ioc_guid": format!("{SRP_IOC_GUID:016x}"),
        "luns": [{"lun": 0, "backstore": "spare"}],
        "acls": [{"initiator": srp_name(&SRP_INI_A)}],
    });
    let back = c.send("POST", ports, &port).unwrap();
    assert_eq!(back["name"], "srp1");
    let r = c
        .send("POST", ports, &port)
        .map(|_| serde_json::Value::Null);
    assert_eq!(status_of(r), (409, Some("name".into())));
    let mut bad = port.clone();
    bad["name"] = serde_json::json!("srp2");
    bad["luns"] = serde_json::json!([{"lun": 0, "backstore": "nope"}]);
    let r = c.send("POST", ports, &bad).map(|_| serde_json::Value::Null);
    assert_eq!(
        status_of(r),
        (422, Some("id_ext".into())),
        "same identifier"
    );
    bad.as_object_mut().unwrap().remove("id_ext");
    let r = c.send("POST", ports, &bad).map(|_| serde_json::Value::Null);
    assert_eq!(status_of(r), (422, Some("backstore".into())));
    let mut elsewhere = port.clone();
    elsewhere["name"] = serde_json::json!("srp3");
    elsewhere.as_object_mut().unwrap().remove("id_ext");
    elsewhere["listen"] = serde_json::json!(["192.0.2.1:5555"]);
    let r = c
        .send("POST", ports, &elsewhere)
        .map(|_| serde_json::Value::Null);
    assert_eq!(
        status_of(r),
        (409, Some("srp[1].listen[0]".into())),
        "an address the RDMA device does not serve"
    );
    elsewhere["listen"] = serde_json::json!([tcp_addr.to_string()]);
    let r = c
        .send("POST", ports, &elsewhere)
        .map(|_| serde_json::Value::Null);
    assert_eq!(
        status_of(r),
        (409, Some("srp[1].listen[0]".into())),
        "the address of an iSER portal"
    );
    let r = c.get::<serde_json::Value>("/api/v1/srp/ports/nope");
    assert_eq!(status_of(r).0, 404);
    // The backstore an SRP LUN maps cannot go.
    let r = c
        .delete("/api/v1/backstores/spare")
        .map(|_| serde_json::Value::Null);
    assert_eq!(status_of(r), (409, Some("name".into())));

    let connect = |id: [u8; 16]| {
        let opts = ConnectOptions::new(id, SRP_ID_EXT, SRP_IOC_GUID);
        rt.block_on(Initiator::connect(hca.cm(), srp_addr, &opts))
    };
    let (a, _a_conn) = connect(SRP_INI_A).expect("SRP login of an admitted initiator");
    match connect(SRP_INI_B) {
        Err(InitiatorError::Rejected(_)) => {}
        other => panic!("SRP login without an ACL: {:?}", other.map(|_| ())),
    }
    c.send(
        "POST",
        &format!("{ports}/srp1/acls"),
        &serde_json::json!({"initiator": srp_name(&SRP_INI_B)}),
    )
    .unwrap();
    let (b, _b_conn) = connect(SRP_INI_B).expect("SRP login after its ACL was added");
    let mut a_uas = Vec::new();
    let mut b_uas = Vec::new();
    rt.block_on(async {
        for _ in 0..3 {
            let r = srp_run(&a, 0, &READ_CAPACITY16, 32, &mut a_uas).await;
            assert_eq!(r.rsp.status, 0);
        }
        assert_eq!(
            srp_run(&b, 0, &READ_CAPACITY16, 32, &mut b_uas)
                .await
                .rsp
                .status,
            0
        );
    });
    let srp_v = sessions_of(&c, "srp");
    assert_eq!(srp_v.len(), 2, "{srp_v:?}");
    let a_view = srp_v
        .iter()
        .find(|s| s.initiator == srp_name(&SRP_INI_A))
        .expect("initiator A listed");
    assert_eq!(a_view.target, "srp1");
    assert_eq!(a_view.session_type, "normal");
    assert!(a_view.id.starts_with("srp-"));
    assert_eq!(
        a_view.queue_depth,
        rtgt_srp::Limits::default().req_lim,
        "the request limit granted"
    );
    assert!(a_view.commands >= 3, "{a_view:?}");
    assert!(a_view.bytes_out >= 3 * 32, "{a_view:?}");
    assert!(a_view.peer.starts_with("127.0.0.42:"), "{a_view:?}");
    assert_eq!(a_view.local, srp_addr.to_string());

    // Per-session series carry the transport.
    let m = c.get_text("/metrics").unwrap();
    for t in ["tcp", "iser", "srp"] {
        assert!(
            m.contains(&format!("transport=\"{t}\"")) && m.contains("rtgt_session_commands_total"),
            "no {t} session series:\n{m}"
        );
    }
    assert!(m.contains(&format!(
        "rtgt_session_queue_depth{{session=\"{}\",initiator=\"{}\",transport=\"srp\"}}",
        a_view.id, a_view.initiator
    )));
    assert!(m.contains("rtgt_sessions{transport=\"srp\"} 2"), "{m}");
    assert!(m.contains("rtgt_sessions{transport=\"iser\"} 1"), "{m}");

    // A LUN added to the port: REPORTED LUNS DATA HAS CHANGED, then REPORT LUNS lists it.
    c.send(
        "POST",
        &format!("{ports}/srp1/luns"),
        &serde_json::json!({"lun": 1, "backstore": "d0"}),
    )
    .unwrap();
    a_uas.clear();
    rt.block_on(async {
        // REPORT LUNS does not report unit attentions (SPC-4 5.14): a command on LUN 0 does.
        let r = srp_run(&a, 0, &READ_CAPACITY16, 32, &mut a_uas).await;
        assert_eq!(r.rsp.status, 0);
        let r = srp_run(&a, 0, &REPORT_LUNS, 256, &mut a_uas).await;
        assert_eq!(r.rsp.status, 0);
        assert_eq!(u32::from_be_bytes(r.data[0..4].try_into().unwrap()), 16);
        let r = srp_run(&a, 1, &READ_CAPACITY16, 32, &mut a_uas).await;
        assert_eq!(r.rsp.status, 0);
        assert_eq!(
            u64::from_be_bytes(r.data[0..8].try_into().unwrap()) + 1,
            (16 << 20) / 512
        );
    });
    assert!(a_uas.contains(&(0x3f, 0x0e)), "{a_uas:?}");
    // Removing B's ACL logs out B only.
    c.delete(&format!("{ports}/srp1/acls/{}", srp_name(&SRP_INI_B)))
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), b.closed())
            .await
            .expect("B's channel closes");
        assert_eq!(
            srp_run(&a, 0, &READ_CAPACITY16, 32, &mut a_uas)
                .await
                .rsp
                .status,
            0
        );
    });
    assert_eq!(
        b.stats.t_logouts.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    wait_for("B's session ends", || sessions_of(&c, "srp").len() == 1);

    // DELETE of a session: SRP_T_LOGOUT for SRP; the iSCSI ones end too.
    c.delete(&format!("/api/v1/sessions/{}", a_view.id))
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), a.closed())
            .await
            .expect("A's channel closes");
    });
    assert_eq!(
        a.stats.t_logouts.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    wait_for("A's session ends", || sessions_of(&c, "srp").is_empty());
    let r = c
        .delete(&format!("/api/v1/sessions/{}", a_view.id))
        .map(|_| serde_json::Value::Null);
    assert_eq!(status_of(r).0, 404);
    let iser_id = iser_v[0].id.clone();
    c.delete(&format!("/api/v1/sessions/{iser_id}")).unwrap();
    wait_for("the iSER session ends", || {
        sessions_of(&c, "iser").is_empty()
    });
    assert_eq!(
        sessions_of(&c, "tcp").len(),
        1,
        "the TCP session is untouched"
    );

    // The port deleted: its listener stops.
    let (a2, _c2) = connect(SRP_INI_A).expect("A logs in again");
    drop(a2);
    c.delete(&format!("{ports}/srp1")).unwrap();
    assert!(
        connect(SRP_INI_A).is_err(),
        "the deleted port still listens"
    );
    let exported: Config = c.get("/api/v1/config").unwrap();
    assert!(exported.srp.is_empty());
    assert!(!d.log().contains("panicked"));
    drop(tcp_s);
    hca.shutdown();
}

fn rtgtctl(d: &Daemon, args: &[&str]) -> (bool, String, String) {
    common::rtgtctl(&d.dir.join("rtgtd.sock"), args)
}

#[test]
fn rtgtctl_commands() {
    let d = Daemon::start("ctl", &base_config(free_port(), NO_TCP_API));
    let (ok, out, err) = rtgtctl(&d, &["backstores", "list"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("NAME") && out.contains("d0") && out.contains("16MiB"),
        "{out}"
    );
    let (ok, _, err) = rtgtctl(
        &d,
        &[
            "backstores",
            "create",
            "r1",
            "--type",
            "ramdisk",
            "--size",
            "4M",
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["luns", "add", TARGET, "3", "r1"]);
    assert!(ok, "{err}");
    let (ok, out, _) = rtgtctl(&d, &["--json", "luns", "list", TARGET]);
    assert!(ok);
    let luns: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(luns[1]["lun"], 3);
    let (ok, _, err) = rtgtctl(&d, &["backstores", "resize", "r1", "8M"]);
    assert!(ok, "{err}");
    // A file backstore: created through the page cache unless asked, switched while mapped.
    let (ok, out, err) = rtgtctl(
        &d,
        &[
            "backstores",
            "create",
            "f1",
            "--type",
            "file",
            "--path",
            "f1.img",
            "--size",
            "1M",
            "--write-cache",
            "false",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains(" page ") && out.contains(" off"), "{out}");
    let (ok, _, err) = rtgtctl(&d, &["luns", "add", TARGET, "4", "f1"]);
    assert!(ok, "{err}");
    let (ok, out, err) = rtgtctl(
        &d,
        &["--json", "backstores", "cache", "f1", "--direct", "true"],
    );
    assert!(ok, "{err}");
    let f1: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&f1[0]["direct"], &f1[0]["write_cache"]),
        (&true.into(), &false.into())
    );
    let (ok, _, err) = rtgtctl(&d, &["backstores", "cache", "f1", "--direct", "maybe"]);
    assert!(!ok && err.contains("maybe"), "{err}");
    let (ok, _, err) = rtgtctl(&d, &["backstores", "cache", "f1"]);
    assert!(!ok && err.contains("--direct"), "{err}");
    let (ok, _, err) = rtgtctl(&d, &["luns", "remove", TARGET, "4"]);
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["backstores", "delete", "f1"]);
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["luns", "add", TARGET, "3", "r1"]);
    assert!(!ok);
    assert!(err.contains("409") && err.contains("taken"), "{err}");
    let (ok, out, _) = rtgtctl(&d, &["export"]);
    assert!(ok);
    let exported = Config::from_yaml(&out, Path::new("export")).unwrap();
    assert_eq!(exported.backstores[2].size.unwrap().0, 8 << 20);
    let (ok, _, err) = rtgtctl(
        &d,
        &[
            "acls",
            "add",
            TARGET,
            "iqn.2025-01.io.rtgt:host-c",
            "--chap-user",
            "c",
            "--chap-secret",
            SECRET,
        ],
    );
    assert!(ok, "{err}");
    let (_, out, _) = rtgtctl(&d, &["acls", "list", TARGET]);
    assert!(out.contains("chap:c") && !out.contains(SECRET), "{out}");
    let (ok, out, _) = rtgtctl(&d, &["sessions", "list"]);
    assert!(ok && out.starts_with("ID"), "{out}");
    // SRP target ports (served once RDMA is up; here only configured).
    let (ok, _, err) = rtgtctl(
        &d,
        &[
            "srp",
            "create",
            "p0",
            "--listen",
            "127.0.0.1:5555",
            "--id-ext",
            "0002c90300000001",
        ],
    );
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["srp", "add-lun", "p0", "0", "r1"]);
    assert!(ok, "{err}");
    let ini = format!("0x{}", "ab".repeat(16));
    let (ok, _, err) = rtgtctl(&d, &["srp", "add-acl", "p0", &ini, "--map", "5=0"]);
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["srp", "add-acl", "p0", "0x12"]);
    assert!(
        !ok && err.contains("422") && err.contains("initiator"),
        "{err}"
    );
    let (ok, out, _) = rtgtctl(&d, &["srp", "list"]);
    assert!(
        ok && out.starts_with("PORT") && out.contains("0=r1") && out.contains("0002c90300000001"),
        "{out}"
    );
    let (ok, out, _) = rtgtctl(&d, &["--json", "srp", "show", "p0"]);
    assert!(ok);
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["acls"][0]["mapped_luns"][0]["lun"], 5);
    let (ok, _, err) = rtgtctl(&d, &["srp", "remove-lun", "p0", "0"]);
    assert!(!ok && err.contains("409"), "{err}");
    let (ok, _, err) = rtgtctl(&d, &["srp", "remove-acl", "p0", &ini]);
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["srp", "remove-lun", "p0", "0"]);
    assert!(ok, "{err}");
    let (ok, _, err) = rtgtctl(&d, &["srp", "delete", "p0"]);
    assert!(ok, "{err}");
    // apply FILE: the (redacted) export applied again changes nothing; an older one
    // changes back exactly what differs.
    let (ok, now, _) = rtgtctl(&d, &["export"]);
    assert!(
        ok && now.contains("********") && !now.contains(SECRET),
        "{now}"
    );
    let file = d.dir.join("export.yaml");
    std::fs::write(&file, &now).unwrap();
    let (ok, out, err) = rtgtctl(&d, &["apply", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no changes");
    std::fs::write(&file, exported.to_yaml()).unwrap();
    let (ok, out, err) = rtgtctl(&d, &["apply", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        format!("removed acl {TARGET}/tpg1/acl/iqn.2025-01.io.rtgt:host-c")
    );
    let (ok, out, _) = rtgtctl(&d, &["status"]);
    assert!(ok && out.contains("ready"));
    // import-lio works offline.
    let lio = d.dir.join("saveconfig.json");
    std::fs::write(
        &lio,
        r#"{"storage_objects": [{"name": "r", "plugin": "ramdisk", "size": 1048576}],
            "targets": [{"fabric": "iscsi", "wwn": "iqn.2003-01.org.linux-iscsi.h:sn.1",
              "tpgs": [{"tag": 1, "attributes": {"generate_node_acls": 1},
                "portals": [{"ip_address": "0.0.0.0", "port": 3260}],
                "luns": [{"index": 0, "storage_object": "/backstores/ramdisk/r"}],
                "node_acls": [{"node_wwn": "iqn.1994-05.com.redhat:client",
                  "chap_userid": "client", "chap_password": "chap-secret-never-shown"}]}]}]}"#,
    )
    .unwrap();
    let (ok, out, err) = rtgtctl(&d, &["import-lio", lio.to_str().unwrap()]);
    assert!(ok, "{err}");
    // Its CHAP secrets only when asked for, or into a file.
    assert!(
        !out.contains(SECRET) && out.contains("********") && err.contains("--secrets"),
        "{out}{err}"
    );
    let (ok, out, _) = rtgtctl(&d, &["import-lio", "--secrets", lio.to_str().unwrap()]);
    assert!(ok && out.contains(SECRET));
    let c = Config::from_yaml(&out, Path::new("import")).unwrap();
    assert!(c.targets[0].portal_groups[0].allow_any_initiator);
    let converted = d.dir.join("converted.yaml");
    let (ok, out, _) = rtgtctl(
        &d,
        &[
            "import-lio",
            lio.to_str().unwrap(),
            "-o",
            converted.to_str().unwrap(),
        ],
    );
    assert!(ok && out.is_empty());
    assert!(std::fs::read_to_string(&converted)
        .unwrap()
        .contains(SECRET));
}

/// schemathesis (PyPI) against the OpenAPI document of a running rtgtd: no server error,
/// no answer that violates the document.
#[test]
fn schemathesis_finds_no_server_error() {
    if !prerequisite("schemathesis", &["schemathesis", "--version"]) {
        return;
    }
    let port = free_port();
    let api = format!("api:\n  listen: ['127.0.0.1:{port}']\n");
    // SRP target ports it creates are served on an RDMA device of their own address.
    let config = base_config(free_port(), &api)
        .replace("rdma: {enabled: false}", "rdma: {addresses: [127.0.0.43]}");
    let d = Daemon::start("schemathesis", &config);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/api/schemathesis.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(format!("http://127.0.0.1:{port}"))
        .arg(d.dir.join("api-token"))
        .current_dir(&d.dir)
        .output()
        .expect("run schemathesis");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis failed:\n{text}");
    assert!(!d.log().contains("panicked"));
}

/// One API call of [`every_route_refuses_the_unprivileged`]'s plan.
struct Call {
    method: &'static str,
    /// The route as the OpenAPI document names it.
    route: &'static str,
    path: String,
    body: Option<serde_json::Value>,
}

/// Every operation of the OpenAPI document, with bodies that work, in an order in which
/// each call succeeds for the admin: creations before the reads, updates and deletions of
/// what they created.
fn every_route(srp_listen: &str, portal: u16, extra_portal: u16, nvme_port: u16) -> Vec<Call> {
    use serde_json::json;
    let t = "iqn.2025-01.io.rtgt:probe";
    let ini = "iqn.2025-01.io.rtgt:probe-host";
    let srp_ini = "0x0000000000000000000000000000abcd";
    let tp = format!("/api/v1/targets/{}", segment(t));
    let g = format!("{tp}/tpgs/2");
    let a = format!("{g}/acls/{}", segment(ini));
    let s = "/api/v1/srp/ports/probe";
    let nqn = "nqn.2025-01.io.rtgt:probe";
    let n = format!("/api/v1/nvme/subsystems/{}", segment(nqn));
    let host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ab";
    let sub = json!({"nqn": nqn, "namespaces": []});
    let bs = json!({"name": "probe", "type": "ramdisk", "size": "8MiB"});
    let mut bs2 = bs.clone();
    bs2["size"] = json!("16MiB");
    let tpg1 = json!({"tag": 1, "portals": [format!("127.0.0.1:{portal}")]});
    let tpg2 = json!({"tag": 2, "portals": [format!("127.0.0.2:{portal}")]});
    let target = json!({"name": t, "portal_groups": [tpg1]});
    let auth = json!({"chap": {"user": "probe", "secret": "probe-secret-12"}});
    let acl = json!({"initiator": ini});
    let srp = json!({"name": "probe", "listen": [srp_listen]});
    let srp_acl = json!({"initiator": srp_ini});
    let c = |method, route, path: &str, body: Option<&serde_json::Value>| Call {
        method,
        route,
        path: path.to_string(),
        body: body.cloned(),
    };
    vec![
        c("GET", "/api/v1/health", "/api/v1/health", None),
        c("GET", "/api/v1/ready", "/api/v1/ready", None),
        c("GET", "/api/v1/openapi.json", "/api/v1/openapi.json", None),
        c("GET", "/metrics", "/metrics", None),
        c("GET", "/api/v1/backstores", "/api/v1/backstores", None),
        c(
            "POST",
            "/api/v1/backstores",
            "/api/v1/backstores",
            Some(&bs),
        ),
        c(
            "GET",
            "/api/v1/backstores/{name}",
            "/api/v1/backstores/probe",
            None,
        ),
        c(
            "PUT",
            "/api/v1/backstores/{name}",
            "/api/v1/backstores/probe",
            Some(&bs2),
        ),
        c("GET", "/api/v1/targets", "/api/v1/targets", None),
        c("POST", "/api/v1/targets", "/api/v1/targets", Some(&target)),
        c("GET", "/api/v1/targets/{target}", &tp, None),
        c("PUT", "/api/v1/targets/{target}", &tp, Some(&target)),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs",
            &format!("{tp}/tpgs"),
            None,
        ),
        c(
            "POST",
            "/api/v1/targets/{target}/tpgs",
            &format!("{tp}/tpgs"),
            Some(&tpg2),
        ),
        c("GET", "/api/v1/targets/{target}/tpgs/{tag}", &g, None),
        c(
            "PUT",
            "/api/v1/targets/{target}/tpgs/{tag}",
            &g,
            Some(&tpg2),
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/portals",
            &format!("{g}/portals"),
            None,
        ),
        c(
            "POST",
            "/api/v1/targets/{target}/tpgs/{tag}/portals",
            &format!("{g}/portals"),
            Some(&json!({"address": format!("127.0.0.2:{extra_portal}")})),
        ),
        c(
            "DELETE",
            "/api/v1/targets/{target}/tpgs/{tag}/portals/{portal}",
            &format!(
                "{g}/portals/{}",
                segment(&format!("127.0.0.2:{extra_portal}"))
            ),
            None,
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/auth",
            &format!("{g}/auth"),
            None,
        ),
        c(
            "PUT",
            "/api/v1/targets/{target}/tpgs/{tag}/auth",
            &format!("{g}/auth"),
            Some(&auth),
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/luns",
            &format!("{g}/luns"),
            None,
        ),
        c(
            "POST",
            "/api/v1/targets/{target}/tpgs/{tag}/luns",
            &format!("{g}/luns"),
            Some(&json!({"lun": 0, "backstore": "probe"})),
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/luns/{lun}",
            &format!("{g}/luns/0"),
            None,
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/acls",
            &format!("{g}/acls"),
            None,
        ),
        c(
            "POST",
            "/api/v1/targets/{target}/tpgs/{tag}/acls",
            &format!("{g}/acls"),
            Some(&acl),
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}",
            &a,
            None,
        ),
        c(
            "PUT",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}",
            &a,
            Some(&acl),
        ),
        c(
            "GET",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/auth",
            &format!("{a}/auth"),
            None,
        ),
        c(
            "PUT",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/auth",
            &format!("{a}/auth"),
            Some(&auth),
        ),
        c(
            "POST",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns",
            &format!("{a}/mapped_luns"),
            Some(&json!({"lun": 0, "tpg_lun": 0})),
        ),
        c(
            "DELETE",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}/mapped_luns/{lun}",
            &format!("{a}/mapped_luns/0"),
            None,
        ),
        c(
            "DELETE",
            "/api/v1/targets/{target}/tpgs/{tag}/acls/{initiator}",
            &a,
            None,
        ),
        c(
            "DELETE",
            "/api/v1/targets/{target}/tpgs/{tag}/luns/{lun}",
            &format!("{g}/luns/0"),
            None,
        ),
        c("DELETE", "/api/v1/targets/{target}/tpgs/{tag}", &g, None),
        c(
            "GET",
            "/api/v1/discovery/auth",
            "/api/v1/discovery/auth",
            None,
        ),
        c(
            "PUT",
            "/api/v1/discovery/auth",
            "/api/v1/discovery/auth",
            Some(&auth),
        ),
        c("GET", "/api/v1/alua", "/api/v1/alua", None),
        c(
            "PUT",
            "/api/v1/alua",
            "/api/v1/alua",
            Some(&json!({"transition_secs": 5, "groups": [{"id": 0}]})),
        ),
        c("GET", "/api/v1/alua/states", "/api/v1/alua/states", None),
        c(
            "PUT",
            "/api/v1/alua/groups/{id}/state",
            "/api/v1/alua/groups/0/state",
            Some(&json!({"state": "active_non_optimized", "preferred": true})),
        ),
        c("GET", "/api/v1/srp/ports", "/api/v1/srp/ports", None),
        c("POST", "/api/v1/srp/ports", "/api/v1/srp/ports", Some(&srp)),
        c("GET", "/api/v1/srp/ports/{name}", s, None),
        c("PUT", "/api/v1/srp/ports/{name}", s, Some(&srp)),
        c(
            "GET",
            "/api/v1/srp/ports/{name}/luns",
            &format!("{s}/luns"),
            None,
        ),
        c(
            "POST",
            "/api/v1/srp/ports/{name}/luns",
            &format!("{s}/luns"),
            Some(&json!({"lun": 0, "backstore": "probe"})),
        ),
        c(
            "GET",
            "/api/v1/srp/ports/{name}/luns/{lun}",
            &format!("{s}/luns/0"),
            None,
        ),
        c(
            "GET",
            "/api/v1/srp/ports/{name}/acls",
            &format!("{s}/acls"),
            None,
        ),
        c(
            "POST",
            "/api/v1/srp/ports/{name}/acls",
            &format!("{s}/acls"),
            Some(&srp_acl),
        ),
        c(
            "GET",
            "/api/v1/srp/ports/{name}/acls/{initiator}",
            &format!("{s}/acls/{srp_ini}"),
            None,
        ),
        c(
            "PUT",
            "/api/v1/srp/ports/{name}/acls/{initiator}",
            &format!("{s}/acls/{srp_ini}"),
            Some(&srp_acl),
        ),
        c(
            "DELETE",
            "/api/v1/srp/ports/{name}/acls/{initiator}",
            &format!("{s}/acls/{srp_ini}"),
            None,
        ),
        c(
            "DELETE",
            "/api/v1/srp/ports/{name}/luns/{lun}",
            &format!("{s}/luns/0"),
            None,
        ),
        c("DELETE", "/api/v1/srp/ports/{name}", s, None),
        c("GET", "/api/v1/sessions", "/api/v1/sessions", None),
        c("GET", "/api/v1/rdma", "/api/v1/rdma", None),
        // No such session: the handler's 404 (and the read-only token's 403 for DELETE).
        c(
            "GET",
            "/api/v1/sessions/{id}",
            "/api/v1/sessions/iscsi-999999",
            None,
        ),
        c(
            "DELETE",
            "/api/v1/sessions/{id}",
            "/api/v1/sessions/iscsi-999999",
            None,
        ),
        c("GET", "/api/v1/nvme", "/api/v1/nvme", None),
        c("PUT", "/api/v1/nvme", "/api/v1/nvme", Some(&json!({}))),
        c(
            "GET",
            "/api/v1/nvme/subsystems",
            "/api/v1/nvme/subsystems",
            None,
        ),
        c(
            "POST",
            "/api/v1/nvme/subsystems",
            "/api/v1/nvme/subsystems",
            Some(&sub),
        ),
        c("GET", "/api/v1/nvme/subsystems/{nqn}", &n, None),
        c("PUT", "/api/v1/nvme/subsystems/{nqn}", &n, Some(&sub)),
        c(
            "POST",
            "/api/v1/nvme/subsystems/{nqn}/namespaces",
            &format!("{n}/namespaces"),
            Some(&json!({"nsid": 1, "backstore": "probe"})),
        ),
        c(
            "POST",
            "/api/v1/nvme/subsystems/{nqn}/hosts",
            &format!("{n}/hosts"),
            Some(&json!({ "nqn": host })),
        ),
        c(
            "DELETE",
            "/api/v1/nvme/subsystems/{nqn}/hosts/{host}",
            &format!("{n}/hosts/{}", segment(host)),
            None,
        ),
        c(
            "DELETE",
            "/api/v1/nvme/subsystems/{nqn}/namespaces/{nsid}",
            &format!("{n}/namespaces/1"),
            None,
        ),
        c("GET", "/api/v1/nvme/ports", "/api/v1/nvme/ports", None),
        c(
            "POST",
            "/api/v1/nvme/ports",
            "/api/v1/nvme/ports",
            Some(&json!({"id": 9, "transport": "tcp", "listen": format!("127.0.0.1:{nvme_port}")})),
        ),
        c(
            "DELETE",
            "/api/v1/nvme/ports/{id}",
            "/api/v1/nvme/ports/9",
            None,
        ),
        c("DELETE", "/api/v1/nvme/subsystems/{nqn}", &n, None),
        c("GET", "/api/v1/config", "/api/v1/config", None),
        c("GET", "/api/v1/config", "/api/v1/config?secrets=true", None),
        c("DELETE", "/api/v1/targets/{target}", &tp, None),
        c(
            "DELETE",
            "/api/v1/backstores/{name}",
            "/api/v1/backstores/probe",
            None,
        ),
    ]
}

/// Runs `calls` through tests/api/probe.py as uid/gid 65534 against `endpoint`
/// (`tcp:HOST:PORT` or `unix:PATH`), each with `token`; returns per call the HTTP status, or
/// the error text when no answer came.
fn probe_as_nobody(
    endpoint: &str,
    calls: &[(&Call, Option<&str>)],
    config_doc: Option<&Config>,
) -> Vec<Result<u16, String>> {
    use std::os::unix::process::CommandExt;
    // The probe must be readable by the unprivileged user wherever the checkout is.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = dir.path().join("probe.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/api/probe.py"),
        &script,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let plan = serde_json::json!({
        "endpoint": endpoint,
        "calls": calls.iter().map(|(c, token)| {
            let body = if c.method == "PUT" && c.route == "/api/v1/config" {
                config_doc.map(|d| serde_json::to_value(d).unwrap())
            } else {
                c.body.clone()
            };
            serde_json::json!({"method": c.method, "path": c.path, "body": body, "token": token})
        }).collect::<Vec<_>>(),
    });
    let mut child = Command::new("/usr/bin/python3")
        .arg(&script)
        .uid(65534)
        .gid(65534)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3 as uid 65534");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plan.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    answers
        .iter()
        .map(|a| match a["status"].as_u64() {
            Some(s) => Ok(s as u16),
            None => Err(a["error"].as_str().unwrap_or("?").to_string()),
        })
        .collect()
}

/// An unprivileged local user calls every route of the OpenAPI document on every listener
/// — without a token, with a wrong one, on the socket — and changes nothing; the read-only
/// token reads and cannot change; the admin token does it all.
#[test]
fn every_route_refuses_the_unprivileged() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip_or_fail("calling the API as another user needs root");
    }
    if !prerequisite("python3", &["/usr/bin/python3", "--version"]) {
        return;
    }
    let (lo, any, metrics) = (free_port(), free_port(), free_port());
    let api = format!(
        "api:\n  listen: ['127.0.0.1:{lo}', '0.0.0.0:{any}']\n  metrics_listen: ['127.0.0.1:{metrics}']\n"
    );
    let rdma_ip = "127.0.0.45";
    let config = base_config(free_port(), &api).replace(
        "rdma: {enabled: false}",
        &format!("rdma: {{addresses: [{rdma_ip}]}}"),
    );
    let d = Daemon::start("unprivileged", &config);
    let srp_listen = format!("{rdma_ip}:{}", free_port());
    let calls = every_route(&srp_listen, free_port(), free_port(), free_port());

    // The plan covers every operation the API documents.
    let doc = rtgt_api::server::openapi();
    let mut documented = std::collections::BTreeSet::new();
    for (path, item) in &doc.paths.paths {
        for (m, op) in [
            ("GET", &item.get),
            ("PUT", &item.put),
            ("POST", &item.post),
            ("DELETE", &item.delete),
        ] {
            if op.is_some() {
                documented.insert(format!("{m} {path}"));
            }
        }
    }
    let planned: std::collections::BTreeSet<String> = calls
        .iter()
        .map(|c| format!("{} {}", c.method, c.route))
        .chain(std::iter::once("PUT /api/v1/config".to_string()))
        .collect();
    assert_eq!(
        documented, planned,
        "the plan must cover every documented operation"
    );

    // Last, when the admin has removed what it made: the document it started from.
    let mut calls = calls;
    calls.push(Call {
        method: "PUT",
        route: "/api/v1/config",
        path: "/api/v1/config".into(),
        body: None,
    });
    let read = |name: &str| {
        std::fs::read_to_string(d.dir.join(name))
            .unwrap()
            .trim()
            .to_string()
    };
    let (admin, reader) = (read("api-token"), read("api-token-read"));
    let on_disk = || std::fs::read(&d.config).unwrap();
    let before = on_disk();
    let current: Config = d.client().get("/api/v1/config").unwrap();
    let public = |c: &Call| matches!(c.route, "/api/v1/health" | "/api/v1/openapi.json");
    let changes = |c: &Call| c.method != "GET" || c.path.contains("secrets=true");
    let unchanged = |what: &str| {
        assert!(
            on_disk() == before,
            "{what}: the configuration file changed"
        );
        let now: Config = d.client().get("/api/v1/config").unwrap();
        assert_eq!(now.backstores.len(), 2, "{what}: a backstore appeared");
        assert!(now.srp.is_empty() && now.targets.len() == 1, "{what}");
    };

    // 1. No token, or a wrong one, on both TCP listeners: 401 for all but the public two.
    for port in [lo, any] {
        for token in [
            None,
            Some("0123456789abcdef0123456789abcdef"),
            Some(&reader[..20]),
        ] {
            let plan: Vec<_> = calls.iter().map(|c| (c, token)).collect();
            let got = probe_as_nobody(&format!("tcp:127.0.0.1:{port}"), &plan, Some(&current));
            for (c, r) in calls.iter().zip(&got) {
                let want = if public(c) { 200 } else { 401 };
                assert_eq!(
                    r,
                    &Ok(want),
                    "{} {} on {port} with {token:?}",
                    c.method,
                    c.path
                );
            }
        }
        unchanged("no token");
    }
    // 2. The metrics listener answers /metrics and nothing else.
    let plan: Vec<_> = calls.iter().map(|c| (c, None)).collect();
    let got = probe_as_nobody(&format!("tcp:127.0.0.1:{metrics}"), &plan, Some(&current));
    for (c, r) in calls.iter().zip(&got) {
        let r = r.clone().unwrap();
        if c.route == "/metrics" {
            assert_eq!(r, 200);
        } else {
            assert!(
                r == 404 || r == 405,
                "{} {} on the metrics listener: {r}",
                c.method,
                c.path
            );
        }
    }
    let m = Client::url(&format!("http://127.0.0.1:{metrics}"))
        .unwrap()
        .request("GET", "/metrics", None, &[])
        .unwrap()
        .text();
    assert!(
        !m.contains(&d.dir.display().to_string()),
        "metrics show a path"
    );
    assert!(!m.contains("d0.img") && !m.contains(SECRET));
    unchanged("metrics listener");
    // 3. The socket: its mode keeps the user out; were it opened to everyone, the peer
    //    check would still refuse every call.
    let socket = d.dir.join("rtgtd.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert!(mode & 0o007 == 0, "socket mode {mode:o}");
    let endpoint = format!("unix:{}", socket.display());
    let got = probe_as_nobody(&endpoint, &plan, Some(&current));
    assert!(
        got.iter()
            .all(|r| r.as_ref().is_err_and(|e| e.contains("Permission"))),
        "{got:?}"
    );
    let dir_mode = std::fs::metadata(&d.dir).unwrap().permissions().mode();
    std::fs::set_permissions(&d.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let got = probe_as_nobody(&endpoint, &plan, Some(&current));
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(mode)).unwrap();
    std::fs::set_permissions(&d.dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    for (c, r) in calls.iter().zip(&got) {
        assert_eq!(r, &Ok(403), "{} {} on the socket", c.method, c.path);
    }
    unchanged("socket");
    assert!(d.log().contains("API socket: caller refused"));

    // 4. Each call with the read-only token, then with the admin token: the read-only
    //    token reads (no secrets) and is refused every change; the admin does it all.
    let plan: Vec<_> = calls
        .iter()
        .flat_map(|c| [(c, Some(reader.as_str())), (c, Some(admin.as_str()))])
        .collect();
    let got = probe_as_nobody(&format!("tcp:127.0.0.1:{lo}"), &plan, Some(&current));
    for ((c, token), r) in plan.iter().zip(&got) {
        let r = r.clone().unwrap();
        let who = if *token == Some(admin.as_str()) {
            "admin"
        } else {
            "read-only"
        };
        if who == "read-only" && changes(c) {
            assert_eq!(r, 403, "{} {} with the read-only token", c.method, c.path);
        } else if c.route == "/api/v1/sessions/{id}" {
            assert_eq!(r, 404, "{} {} with the {who} token", c.method, c.path);
        } else {
            assert!(
                (200..300).contains(&r),
                "{} {} with the {who} token: {r}",
                c.method,
                c.path
            );
        }
    }
    // The admin's calls created and removed their objects again, and the document it put
    // back is the one it started with.
    let after: Config = d.client().get("/api/v1/config").unwrap();
    assert_eq!(after.backstores.len(), 2);
    assert!(after.srp.is_empty() && after.targets.len() == 1);
    assert_eq!(after.nvme, rtgt_api::nvme::Nvme::default());
    assert!(!d.log().contains(&admin) && !d.log().contains(&reader));
}

/// rtgtd started as the quick start does: in a directory of its own, with the default
/// state directory `./rtgt-state`; killed on drop.
struct InDirectory {
    child: Child,
    dir: PathBuf,
}

impl Drop for InDirectory {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("rtgtd state and log kept in {}", self.dir.display());
        }
    }
}

/// rtgtctl run in `dir` with `args`, `env` and `stdin`, none of the RTGT_ variables
/// inherited.
fn rtgtctl_in(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&str>,
) -> (bool, String, String) {
    use std::io::Write;
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let mut cmd = Command::new(BIN.get_or_init(rtgtctl_bin));
    for v in [
        "RTGT_SOCKET",
        "RTGT_URL",
        "RTGT_TOKEN",
        "RTGT_TOKEN_FILE",
        "RTGT_CA_FILE",
    ] {
        cmd.env_remove(v);
    }
    let mut child = cmd
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rtgtctl");
    if let Some(text) = stdin {
        let mut input = child.stdin.take().unwrap();
        input.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().expect("run rtgtctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn rtgtctl_finds_rtgtd_and_applies_documents() {
    let dir = std::env::temp_dir().join(format!("rtgt-api-quickstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The loopback listener, and one on every address that needs the token (so that the
    // token file exists and is checked whatever loopback listeners ask for).
    let (open, guarded) = (free_port(), free_port());
    let api = format!("api:\n  listen: ['127.0.0.1:{open}', '0.0.0.0:{guarded}']\n");
    let file = dir.join("rtgt.yaml");
    std::fs::write(&file, base_config(free_port(), &api)).unwrap();
    let log = std::fs::File::create(dir.join("rtgtd.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_rtgtd"))
        .arg("--config")
        .arg("rtgt.yaml")
        .current_dir(&dir)
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start rtgtd");
    let mut d = InDirectory {
        child,
        dir: dir.clone(),
    };
    let sock = dir.join("rtgt-state/rtgtd.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !Client::unix(&sock)
        .request("GET", "/api/v1/ready", None, &[])
        .is_ok_and(|r| r.status == 200)
    {
        if let Ok(Some(st)) = d.child.try_wait() {
            panic!(
                "rtgtd exited with {st}:\n{}",
                std::fs::read_to_string(dir.join("rtgtd.log")).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "rtgtd not ready");
        std::thread::sleep(Duration::from_millis(50));
    }

    // No flags: the socket of the working directory.
    let (ok, before, err) = rtgtctl_in(&dir, &["-v", "export"], &[], None);
    assert!(ok, "{err}");
    assert!(before.contains(TARGET), "{before}");
    assert!(
        err.contains(
            "rtgtctl: API at unix socket ./rtgt-state/rtgtd.sock (found in the working directory)"
        ),
        "{err}"
    );
    // RTGT_URL on loopback: the token of ./rtgt-state/api-token, found by itself; the
    // listener on every address refuses requests without it.
    let token = std::fs::read_to_string(dir.join("rtgt-state/api-token"))
        .unwrap()
        .trim()
        .to_string();
    for port in [open, guarded] {
        let url = format!("http://127.0.0.1:{port}");
        let (ok, out, err) = rtgtctl_in(&dir, &["-v", "export"], &[("RTGT_URL", &url)], None);
        assert!(ok, "{err}");
        assert_eq!(out, before);
        assert!(
            err.contains(&format!("rtgtctl: API at {url} (RTGT_URL)"))
                && err.contains("rtgtctl: token from ./rtgt-state/api-token"),
            "{err}"
        );
        assert!(!err.contains(&token), "-v never shows the token");
    }
    // Elsewhere there is no such file: a 401 comes with a hint.
    let elsewhere = dir.join("rtgt-state");
    let url = format!("http://127.0.0.1:{guarded}");
    let (ok, _, err) = rtgtctl_in(&elsewhere, &["export"], &[("RTGT_URL", &url)], None);
    assert!(!ok);
    assert!(
        err.contains("401")
            && err.contains("--token-file FILE (rtgtd's state directory holds api-token)"),
        "{err}"
    );
    // And without a socket to find, what was tried.
    let (ok, _, err) = rtgtctl_in(&elsewhere, &["export"], &[], None);
    if !Path::new("/run/rtgt/rtgtd.sock").exists()
        && !Path::new("/var/lib/rtgt/rtgtd.sock").exists()
    {
        assert!(!ok);
        assert!(
            err.contains("./rtgt-state/rtgtd.sock") && err.contains("/run/rtgt/rtgtd.sock"),
            "{err}"
        );
    }

    // apply -f -: the document on standard input.
    let doc = before.replace(
        "backstores:\n",
        "backstores:\n- name: fromstdin\n  type: ramdisk\n  size: 4MiB\n",
    );
    assert_ne!(doc, before);
    let (ok, out, err) = rtgtctl_in(&dir, &["apply", "-f", "-"], &[], Some(&doc));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "added backstore fromstdin");
    let (_, now, _) = rtgtctl_in(&dir, &["export"], &[], None);
    let running = Config::from_yaml(&now, Path::new("export")).unwrap();
    assert_eq!(running, Config::from_yaml(&doc, Path::new("doc")).unwrap());
    assert!(running.backstore("fromstdin").is_some());

    // apply --dry-run -f FILE: the differences, nothing changed.
    let mut smaller = running.clone();
    smaller.backstores.retain(|b| b.name != "fromstdin");
    smaller.backstores.retain(|b| b.name != "spare");
    smaller.targets[0].portal_groups[0].acls.remove(1);
    let plan = dir.join("plan.yaml");
    std::fs::write(&plan, smaller.to_yaml()).unwrap();
    let saved = std::fs::read(&file).unwrap();
    let (ok, out, err) = rtgtctl_in(&dir, &["apply", "--dry-run", "-f", "plan.yaml"], &[], None);
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["ACTION", "OBJECT", "NAME", "DETAIL"], "{out}");
    assert_eq!(
        rows[1..],
        [
            vec![
                "removed".to_string(),
                "acl".into(),
                format!("{TARGET}/tpg1/acl/{INI_B}")
            ],
            vec!["removed".into(), "backstore".into(), "fromstdin".into()],
            vec!["removed".into(), "backstore".into(), "spare".into()],
            vec![
                "(dry".into(),
                "run:".into(),
                "nothing".into(),
                "changed)".into()
            ],
        ]
    );
    let (_, after, _) = rtgtctl_in(&dir, &["export"], &[], None);
    assert_eq!(after, now, "a dry run changes nothing");
    assert_eq!(std::fs::read(&file).unwrap(), saved, "nor the file");
    let (ok, out, err) = rtgtctl_in(
        &dir,
        &["--json", "apply", "--dry-run", "plan.yaml"],
        &[],
        None,
    );
    assert!(ok && err.contains("(dry run: nothing changed)"), "{err}");
    let r: ChangeReport = serde_json::from_str(&out).unwrap();
    assert_eq!(r.changes.len(), 3);
    // A dry run validates as an apply does.
    let (ok, _, err) = rtgtctl_in(
        &dir,
        &["apply", "--dry-run", "-f", "-"],
        &[],
        Some("backstores: [{name: x, type: ramdisk}]\n"),
    );
    assert!(!ok && err.contains("422") && err.contains("size"), "{err}");
    // Then the real thing.
    let (ok, out, err) = rtgtctl_in(&dir, &["apply", "plan.yaml"], &[], None);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 3, "{out}");
    // The OpenAPI document lists the parameter.
    let doc: serde_json::Value = Client::unix(&sock).get("/api/v1/openapi.json").unwrap();
    let params = &doc["paths"]["/api/v1/config"]["put"]["parameters"];
    assert_eq!(params[0]["name"], "dry_run", "{params}");
}

/// `api.tls`: every TCP listener speaks HTTPS with the configured certificate; the token
/// is still required; a plain HTTP request gets no answer; rtgtctl trusts the certificate
/// with --ca-file.
#[test]
fn tls_listeners() {
    let port = free_port();
    let api = format!(
        "api:\n  listen: ['127.0.0.1:{port}']\n  tls: {{cert: tls/cert.pem, key: tls/key.pem}}\n"
    );
    let dir = std::env::temp_dir().join(format!("rtgt-api-tls-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let ca = dir.join("cert.pem");
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    // The daemon reads the pair from its state directory (relative paths).
    let d = Daemon::start_with(
        "tls",
        &base_config(free_port(), &api),
        &[
            ("tls/cert.pem", cert.cert.pem()),
            ("tls/key.pem", cert.key_pair.serialize_pem()),
        ],
    );
    let token = std::fs::read_to_string(d.dir.join("api-token")).unwrap();
    let https = |token: Option<&str>| {
        Client::url(&format!("https://127.0.0.1:{port}"))
            .unwrap()
            .with_ca_file(&ca)
            .unwrap()
            .with_token(token.map(|t| t.trim().to_string()))
    };
    let cfg: Config = https(Some(&token)).get("/api/v1/config").unwrap();
    assert_eq!(cfg.backstores.len(), 2);
    let r = https(None)
        .request("GET", "/api/v1/config", None, &[])
        .unwrap();
    assert_eq!(r.status, 401);
    // Without the CA the client refuses the server; plain HTTP gets no HTTP answer.
    let untrusted = Client::url(&format!("https://127.0.0.1:{port}"))
        .unwrap()
        .with_token(Some(token.trim().to_string()))
        .request("GET", "/api/v1/config", None, &[]);
    assert!(untrusted.is_err());
    let plain = Client::url(&format!("http://127.0.0.1:{port}"))
        .unwrap()
        .with_token(Some(token.trim().to_string()))
        .request("GET", "/api/v1/config", None, &[]);
    assert!(plain.is_err() || plain.unwrap().status != 200);
    let out = Command::new(rtgtctl_bin())
        .args(["--url", &format!("https://127.0.0.1:{port}"), "--ca-file"])
        .arg(&ca)
        .arg("--token-file")
        .arg(d.dir.join("api-token"))
        .args(["backstores", "list"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("spare"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The target port group and relative port of VPD 0x83 designators (types 4h and 5h).
fn vpd83_port(d: &[u8]) -> (u16, u16) {
    let (mut at, mut rel, mut group) = (4, 0, 0);
    while at + 4 <= d.len() {
        let len = d[at + 3] as usize;
        let v = u16::from_be_bytes([d[at + 6], d[at + 7]]);
        match d[at + 1] & 0x0f {
            4 => rel = v,
            5 => group = v,
            _ => {}
        }
        at += 4 + len;
    }
    (rel, group)
}

/// A target port group descriptor: group, state code, PREF, relative ports.
type GroupDesc = (u16, u8, bool, Vec<u16>);

/// The implicit transition time and each descriptor of extended REPORT TARGET PORT GROUPS
/// data.
fn rtpg(d: &[u8]) -> (u8, Vec<GroupDesc>) {
    let mut out = Vec::new();
    let mut at = 8;
    while at + 8 <= d.len() {
        let n = d[at + 7] as usize;
        let ports = (0..n)
            .map(|i| u16::from_be_bytes([d[at + 10 + 4 * i], d[at + 11 + 4 * i]]))
            .collect();
        out.push((
            u16::from_be_bytes([d[at + 2], d[at + 3]]),
            d[at] & 0x0f,
            d[at] & 0x80 != 0,
            ports,
        ));
        at += 8 + 4 * n;
    }
    (d[5], out)
}

const RTPG_EXT: [u8; 12] = [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

/// A ramdisk LUN behind portal groups 1 (on `p1`) and 2 (on `p2`) of one target, in ALUA
/// groups 1 and 2, with the `alua` section's body `alua`.
fn two_groups(p1: u16, p2: u16, alua: &str) -> String {
    let tpg = |tag: u16, port: u16| {
        format!(
            "      - {{tag: {tag}, portals: ['127.0.0.1:{port}'], allow_any_initiator: true, alua_group: {tag}, luns: [{{lun: 0, backstore: d0}}], params: {{NopInInterval: 0}}}}\n"
        )
    };
    format!(
        "backstores:\n  - {{name: d0, type: ramdisk, size: 8MiB}}\ntargets:\n  - name: {TARGET}\n    portal_groups:\n{}{}alua:\n  {alua}\nrdma: {{enabled: false}}\n{NO_TCP_API}",
        tpg(1, p1),
        tpg(2, p2)
    )
}

/// Two portal groups of one target in two ALUA groups: what initiators see through each
/// (INQUIRY, VPD 0x83, REPORT TARGET PORT GROUPS, the state's sense), a failover through the
/// API and rtgtctl with the unit attention on both paths, a change that would leave no
/// active group refused with 409, per-backstore states, metrics, persistence across a
/// restart, and a portal group moved to another group ending its sessions.
#[test]
fn alua_groups_through_the_api() {
    let (p1, p2) = (free_port(), free_port());
    let config = two_groups(
        p1,
        p2,
        "transition_secs: 10\n  groups:\n    - {id: 1, preferred: true}\n    - {id: 2, state: active_non_optimized, remote_ports: [9]}",
    );
    let mut d = Daemon::start("alua", &config);
    let c = d.client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = |port: u16, isid: u8| {
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        rt.block_on(Session::connect(addr, login(port, INI_A, isid)))
            .unwrap()
    };
    let (a, b) = (connect(p1, 1), connect(p2, 2));
    let mut uas = Vec::new();
    let cmd = |s: &Session, cdb: &[u8], len: u32, uas: &mut Vec<(u8, u8)>| {
        rt.block_on(run(s, 0, cdb, None, len, uas))
    };

    // What each path reports.
    let r = cmd(&a, &[0x12, 0, 0, 0, 96, 0], 96, &mut uas);
    assert_eq!(r.data[5] & 0x30, 0x10, "TPGS: implicit changes only");
    let r = cmd(&b, &[0x12, 1, 0x83, 0, 255, 0], 255, &mut uas);
    assert_eq!(vpd83_port(&r.data), (2, 2));
    let r = cmd(&a, &[0x12, 1, 0x83, 0, 255, 0], 255, &mut uas);
    assert_eq!(vpd83_port(&r.data), (1, 1));
    let r = cmd(&a, &RTPG_EXT, 1024, &mut uas);
    assert!(r.is_good(), "{r:?}");
    assert_eq!(
        rtpg(&r.data),
        (10, vec![(1, 0, true, vec![1]), (2, 1, false, vec![2, 9])])
    );
    // No explicit changes: SET TARGET PORT GROUPS is not supported.
    let stpg = [0xa4, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0];
    let r = rt
        .block_on(a.command(0, &stpg, Some(Bytes::from(vec![0, 0, 0, 0, 0, 0, 0, 2])), 0))
        .unwrap();
    assert_eq!(r.sense_key(), Some((5, 0x24, 0)), "{r:?}");
    assert!(cmd(&a, &READ10, 512, &mut uas).is_good());
    assert!(cmd(&b, &READ10, 512, &mut uas).is_good());

    // Failover: group 1 to standby. Both paths hear of it; A answers with the state's sense.
    uas.clear();
    let g: serde_json::Value = c
        .send(
            "PUT",
            "/api/v1/alua/groups/1/state",
            &serde_json::json!({"state": "standby"}),
        )
        .unwrap();
    assert_eq!(g["state"], "standby");
    let r = cmd(&a, &READ10, 512, &mut uas);
    assert_eq!(r.sense_key(), Some((2, 0x04, 0x0b)), "{r:?}");
    assert!(cmd(&b, &READ10, 512, &mut uas).is_good());
    assert_eq!(uas, [(0x2a, 0x06), (0x2a, 0x06)]);
    // Standby still sizes the disk.
    assert!(cmd(&a, &READ_CAPACITY16, 32, &mut uas).is_good());

    // No group would stay active: 409, and nothing changes.
    let before = std::fs::read_to_string(&d.config).unwrap();
    let e = c.send(
        "PUT",
        "/api/v1/alua/groups/2/state",
        &serde_json::json!({"state": "standby"}),
    );
    let Err(ClientError::Http {
        status, message, ..
    }) = e
    else {
        panic!("expected 409, got {e:?}");
    };
    assert_eq!(status, 409);
    assert!(message.contains("no active target port group"), "{message}");
    assert_eq!(std::fs::read_to_string(&d.config).unwrap(), before);
    assert!(cmd(&b, &READ10, 512, &mut uas).is_good());
    // Bad requests: an unknown group, an unknown state, an unknown backstore.
    for (path, body, want) in [
        ("/api/v1/alua/groups/7/state", r#"{"state":"standby"}"#, 404),
        ("/api/v1/alua/groups/1/state", r#"{"state":"asleep"}"#, 422),
        (
            "/api/v1/alua/groups/1/state",
            r#"{"state":"standby","backstore":"nope"}"#,
            404,
        ),
    ] {
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            status_of(c.send("PUT", path, &body)).0,
            want,
            "{path} {body}"
        );
    }
    // A portal group in a group the section does not have.
    let mut alua: serde_json::Value = c.get("/api/v1/alua").unwrap();
    alua["groups"][1]["id"] = serde_json::json!(5);
    assert_eq!(status_of(c.send("PUT", "/api/v1/alua", &alua)).0, 422);

    // rtgtctl moves it back; one backstore's state differs on its own.
    let (ok, out, err) = rtgtctl(&d, &["alua", "set", "1", "active_optimized"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = rtgtctl(
        &d,
        &["alua", "set", "2", "unavailable", "--backstore", "d0"],
    );
    assert!(ok, "{out}{err}");
    let r = cmd(&b, &READ10, 512, &mut uas);
    assert_eq!(r.sense_key(), Some((2, 0x04, 0x0c)), "{r:?}");
    assert!(cmd(&a, &READ10, 512, &mut uas).is_good());
    let (ok, out, err) = rtgtctl(&d, &["alua", "show"]);
    assert!(ok, "{out}{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..5], ["d0", "1", "active_optimized", "yes", "1"]);
    assert_eq!(rows[1][..5], ["d0", "2", "unavailable", "no", "2,9"]);
    let alua: rtgt_api::alua::Alua = c.get("/api/v1/alua").unwrap();
    assert_eq!(alua.groups[1].backstores.len(), 1);
    let metrics = c.get_text("/metrics").unwrap();
    assert!(
        metrics.contains("rtgt_alua_access_state{backstore=\"d0\",group=\"2\"} 3"),
        "{metrics}"
    );
    // The same state as the group's is no override.
    let (ok, out, err) = rtgtctl(
        &d,
        &[
            "alua",
            "set",
            "2",
            "active_non_optimized",
            "--backstore",
            "d0",
        ],
    );
    assert!(ok, "{out}{err}");
    let alua: rtgt_api::alua::Alua = c.get("/api/v1/alua").unwrap();
    assert!(alua.groups[1].backstores.is_empty());

    // The states are in the configuration: a restart serves them.
    let (ok, _, _) = rtgtctl(&d, &["alua", "set", "2", "active_optimized"]);
    assert!(ok);
    let states: Vec<rtgt_api::AluaView> = c.get("/api/v1/alua/states").unwrap();
    drop((a, b));
    d.kill9();
    d.spawn();
    let c = d.client();
    assert_eq!(
        c.get::<Vec<rtgt_api::AluaView>>("/api/v1/alua/states")
            .unwrap(),
        states
    );

    // Portal group 2 moves to group 1: its sessions end (the initiator logs in again and
    // finds its new group).
    let b = connect(p2, 2);
    assert!(cmd(&b, &READ10, 512, &mut uas).is_good());
    let mut doc: Config = c.get("/api/v1/config").unwrap();
    doc.targets[0].portal_groups[1].alua_group = Some(1);
    let report: ChangeReport =
        serde_json::from_value(c.send("PUT", "/api/v1/config", &doc).unwrap()).unwrap();
    for (action, object) in [("ended", "session"), ("changed", "target_port")] {
        assert!(
            report
                .changes
                .iter()
                .any(|ch| ch.action == action && ch.object == object),
            "{action} {object}: {report:?}"
        );
    }
    // A dry run names a group's new state.
    let mut doc: Config = c.get("/api/v1/config").unwrap();
    doc.alua.groups[1].state = rtgt_scsi::AccessState::Standby;
    let dry: ChangeReport =
        serde_json::from_value(c.send("PUT", "/api/v1/config?dry_run=true", &doc).unwrap())
            .unwrap();
    assert!(
        dry.changes.iter().any(|ch| ch.object == "alua_group"
            && ch.name == "2"
            && ch
                .detail
                .as_deref()
                .is_some_and(|d| d.starts_with("standby"))),
        "{dry:?}"
    );
    let r = rt.block_on(b.command(0, &READ10, None, 512));
    assert!(r.is_err() || !r.unwrap().is_good());
    let b = connect(p2, 3);
    let r = cmd(&b, &[0x12, 1, 0x83, 0, 255, 0], 255, &mut uas);
    assert_eq!(vpd83_port(&r.data), (2, 1));
    let r = cmd(&b, &RTPG_EXT, 1024, &mut uas);
    assert_eq!(rtpg(&r.data).1[0], (1, 0, true, vec![1, 2]));
    assert!(!d.log().contains("panicked"));
}

/// The Pacemaker resource agent (`deploy/ocf/alua-group`) under `ocf-tester` (every action
/// in the order Pacemaker uses them, idempotence, probes without binaries), then two instances
/// driven as a promotable clone would be through a failover: the owner is demoted and
/// stopped, the other promoted; rtgtd's states follow, and a stop that would leave no active
/// group still succeeds.
#[test]
fn ocf_agent_moves_groups_as_pacemaker_drives_it() {
    if !prerequisite("ocf-tester", &["ocf-tester", "--version"]) {
        return;
    }
    let config = two_groups(
        free_port(),
        free_port(),
        "groups:\n    - {id: 1}\n    - {id: 2, state: active_non_optimized}",
    );
    let d = Daemon::start("ocf", &config);
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/ocf/alua-group");
    let sock = d.dir.join("rtgtd.sock");
    let rtgtctl = rtgtctl_bin();
    let rsctmp = d.dir.join("rsctmp");
    std::fs::create_dir_all(&rsctmp).unwrap();
    let params = |group: u16| {
        vec![
            ("OCF_RESKEY_group".to_string(), group.to_string()),
            ("OCF_RESKEY_socket".into(), sock.display().to_string()),
            ("OCF_RESKEY_rtgtctl".into(), rtgtctl.display().to_string()),
        ]
    };
    // ocf-tester on group 1 (group 2 stays active, so every state of group 1 is allowed).
    let mut tester = Command::new("ocf-tester");
    tester.args(["-n", "rtgt-g1"]);
    for (k, v) in params(1) {
        tester.args([
            "-o",
            &format!("{}={v}", k.trim_start_matches("OCF_RESKEY_")),
        ]);
    }
    let out = tester
        .arg(&agent)
        .env("HA_RSCTMP", &rsctmp)
        .output()
        .expect("run ocf-tester");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ocf-tester failed:\n{text}");
    assert!(text.contains("passed all tests"), "{text}");

    // The agent as a promotable clone runs it.
    let ocf = |group: u16, action: &str| {
        let out = Command::new(&agent)
            .arg(action)
            .envs(params(group))
            .env("OCF_ROOT", "/usr/lib/ocf")
            .env("OCF_RESOURCE_INSTANCE", format!("rtgt-g{group}"))
            .env("HA_RSCTMP", &rsctmp)
            .output()
            .expect("run the agent");
        out.status.code().unwrap_or(-1)
    };
    let states = || {
        let v: Vec<rtgt_api::AluaView> = d.client().get("/api/v1/alua/states").unwrap();
        v.iter().map(|a| a.state.clone()).collect::<Vec<_>>()
    };
    let (running, promoted, not_running) = (0, 8, 7);
    assert_eq!(ocf(1, "monitor"), not_running);
    assert_eq!(ocf(1, "start"), 0);
    assert_eq!(ocf(2, "start"), 0);
    let ano = "active_non_optimized".to_string();
    assert_eq!(states(), [ano.clone(), ano.clone()]);
    assert_eq!(ocf(1, "promote"), 0);
    assert_eq!(ocf(1, "monitor"), promoted);
    assert_eq!(ocf(2, "monitor"), running);
    assert_eq!(states(), ["active_optimized".to_string(), ano.clone()]);
    // Failover: the owner is demoted and stopped, the other promoted.
    assert_eq!(ocf(1, "demote"), 0);
    assert_eq!(ocf(2, "promote"), 0);
    assert_eq!(ocf(1, "stop"), 0);
    assert_eq!(ocf(1, "monitor"), not_running);
    assert_eq!(ocf(2, "monitor"), promoted);
    assert_eq!(
        states(),
        ["unavailable", "active_optimized"].map(String::from)
    );
    // The last active group cannot go: stop succeeds, the group stays active.
    assert_eq!(ocf(2, "stop"), 0);
    assert_eq!(
        states(),
        ["unavailable", "active_optimized"].map(String::from)
    );
    assert_eq!(ocf(2, "monitor"), not_running);
    // Standby when unpromoted: allowed while the other group is active, else it stays
    // active (non-optimized).
    let standby = |group: u16, action: &str| {
        Command::new(&agent)
            .arg(action)
            .envs(params(group))
            .env("OCF_RESKEY_unpromoted_state", "standby")
            .env("OCF_ROOT", "/usr/lib/ocf")
            .env("OCF_RESOURCE_INSTANCE", format!("rtgt-s{group}"))
            .env("HA_RSCTMP", &rsctmp)
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(standby(2, "start"), Some(0));
    assert_eq!(states(), ["unavailable".to_string(), ano.clone()]);
    assert_eq!(standby(1, "start"), Some(0));
    assert_eq!(states(), ["standby".to_string(), ano.clone()]);
    assert_eq!(standby(1, "promote"), Some(0));
    assert_eq!(standby(1, "demote"), Some(0));
    assert_eq!(standby(2, "promote"), Some(0));
    assert_eq!(states(), ["standby", "active_optimized"].map(String::from));
    assert_eq!(standby(1, "promote"), Some(0));
    assert_eq!(standby(2, "demote"), Some(0));
    assert_eq!(states(), ["active_optimized", "standby"].map(String::from));
    assert_eq!(standby(2, "monitor"), Some(running));
    // Bad parameters.
    let bad = Command::new(&agent)
        .arg("validate-all")
        .env("OCF_ROOT", "/usr/lib/ocf")
        .env("OCF_RESKEY_group", "one")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(6), "OCF_ERR_CONFIGURED");
}

/// Two rtgtd export one file as one LUN (one WWN, disjoint ALUA groups, each listing the
/// other's port) with a shared reservation file: initiators logged in to different
/// gateways see one set of registrations and one reservation, and a preemption through
/// one gateway fences the preempted initiator on the other.
#[test]
fn two_gateways_share_one_lun_and_its_reservations() {
    let shared = std::env::temp_dir().join(format!("rtgt-api-shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&shared);
    std::fs::create_dir_all(&shared).unwrap();
    let gateway = |tag: u16, port: u16, remote: u16| {
        format!(
            "\
backstores:
  - {{name: d0, type: file, path: {dir}/d0.img, size: 16MiB, wwn: 6001405aabbccdd0011223344556677b,
     serial: shared0001, shared: {{pr_file: {dir}/d0.pr}}}}
targets:
  - name: {TARGET}
    portal_groups:
      - {{tag: {tag}, portals: ['127.0.0.1:{port}'], allow_any_initiator: true, alua_group: {tag},
         luns: [{{lun: 0, backstore: d0}}], params: {{NopInInterval: 0}}}}
alua:
  groups:
    - {{id: 1{r1}}}
    - {{id: 2, state: active_non_optimized{r2}}}
policy: {{backstore_roots: ['{dir}']}}
rdma: {{enabled: false}}
{NO_TCP_API}",
            dir = shared.display(),
            r1 = if remote == 1 {
                ", remote_ports: [1]"
            } else {
                ""
            },
            r2 = if remote == 2 {
                ", remote_ports: [2]"
            } else {
                ""
            },
        )
    };
    let (p1, p2) = (free_port(), free_port());
    let g1 = Daemon::start("gw1", &gateway(1, p1, 2));
    let g2 = Daemon::start("gw2", &gateway(2, p2, 1));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = |port: u16, ini: &str| {
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        rt.block_on(Session::connect(addr, login(port, ini, 1)))
            .unwrap()
    };
    let (a, b) = (connect(p1, INI_A), connect(p2, INI_B));
    let mut uas = Vec::new();
    let cmd =
        |s: &Session, cdb: &[u8], data: Option<Vec<u8>>, len: u32, uas: &mut Vec<(u8, u8)>| {
            rt.block_on(run(s, 0, cdb, data.map(Bytes::from), len, uas))
        };
    let prout = |sa: u8, ty: u8, key: u64, sark: u64| {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sark.to_be_bytes());
        (vec![0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], p)
    };
    let keys = |s: &Session, uas: &mut Vec<(u8, u8)>| {
        let r = cmd(s, &[0x5e, 0, 0, 0, 0, 0, 0, 1, 0, 0], None, 256, uas);
        assert!(r.is_good(), "{r:?}");
        r.data[8..]
            .chunks(8)
            .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
            .collect::<Vec<_>>()
    };
    let write = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

    // One LUN: the same identity and the same groups through both gateways.
    let vpd = |s: &Session, uas: &mut Vec<(u8, u8)>| {
        cmd(s, &[0x12, 1, 0x83, 0, 255, 0], None, 255, uas).data
    };
    let (va, vb) = (vpd(&a, &mut uas), vpd(&b, &mut uas));
    assert_eq!(va[4..24], vb[4..24], "the NAA designator");
    assert_eq!((vpd83_port(&va), vpd83_port(&vb)), ((1, 1), (2, 2)));
    let ra = cmd(&a, &RTPG_EXT, None, 1024, &mut uas);
    let rb = cmd(&b, &RTPG_EXT, None, 1024, &mut uas);
    assert_eq!(rtpg(&ra.data), rtpg(&rb.data));
    assert_eq!(
        rtpg(&ra.data).1,
        [(1, 0, false, vec![1]), (2, 1, false, vec![2])]
    );
    // Data written through one gateway is read through the other.
    let block: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
    assert!(cmd(&a, &write, Some(block.clone()), 0, &mut uas).is_good());
    assert_eq!(cmd(&b, &read, None, 512, &mut uas).data, block);

    // Registrations through either gateway, a reservation through A.
    let (c, p) = prout(0, 0, 0, 0xaaaa);
    assert!(cmd(&a, &c, Some(p), 0, &mut uas).is_good());
    assert_eq!(keys(&b, &mut uas), [0xaaaa]);
    let (c, p) = prout(0, 0, 0, 0xbbbb);
    assert!(cmd(&b, &c, Some(p), 0, &mut uas).is_good());
    assert_eq!(keys(&a, &mut uas), [0xaaaa, 0xbbbb]);
    let (c, p) = prout(1, 1, 0xaaaa, 0);
    assert!(cmd(&a, &c, Some(p), 0, &mut uas).is_good());
    let r = cmd(&b, &write, Some(block.clone()), 0, &mut uas);
    assert_eq!(r.status, 0x18, "B's write against A's reservation: {r:?}");
    assert!(cmd(&b, &read, None, 512, &mut uas).is_good());
    // B preempts A through gateway 2: gateway 1 tells A and fences it.
    uas.clear();
    let (c, p) = prout(4, 1, 0xbbbb, 0xaaaa);
    assert!(cmd(&b, &c, Some(p), 0, &mut uas).is_good());
    assert!(cmd(&b, &write, Some(block.clone()), 0, &mut uas).is_good());
    let r = cmd(&a, &write, Some(block), 0, &mut uas);
    assert_eq!(r.status, 0x18, "A's write after the preemption: {r:?}");
    assert!(
        uas.contains(&(0x2a, 0x05)),
        "REGISTRATIONS PREEMPTED: {uas:?}"
    );
    assert_eq!(keys(&a, &mut uas), [0xbbbb]);
    let pr = std::fs::read_to_string(shared.join("d0.pr")).unwrap();
    assert!(pr.contains("bbbb"), "{pr}");
    drop((g1, g2));
    let _ = std::fs::remove_dir_all(&shared);
}
