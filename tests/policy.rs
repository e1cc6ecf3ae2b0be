//! The backstore path policy end to end: through the API of a running rtgtd, paths out of
//! the backstore roots (absolute, `..`, symlinks), devices and FIFOs are refused with 403
//! and leave the files they name alone; an existing file keeps its size; a file in a root
//! serves a LUN; a mounted or exclusively opened block device is refused and a free one
//! serves. At start, a refused path makes rtgtd exit with the reason.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, prerequisite, skip_or_fail, Rtgtd, TEST_IQN};
use rtgt_api::client::{Client, ClientError};
use rtgt_tools::iscsi::{LoginConfig, Session};

fn config(port: u16, roots: &[&Path]) -> String {
    let roots: Vec<String> = roots.iter().map(|r| format!("'{}'", r.display())).collect();
    format!(
        "backstores:\n  - {{name: seed, type: ramdisk, size: 1MiB}}\n\
         targets:\n  - name: {TEST_IQN}\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:{port}']\n        allow_any_initiator: true\n        luns: [{{lun: 0, backstore: seed}}]\n\
         api: {{listen: []}}\n\
         policy: {{backstore_roots: [{}]}}\n",
        roots.join(", ")
    )
}

/// The API client of `d`, once its socket answers (it opens after the portals).
fn client(d: &Rtgtd) -> Client {
    let c = Client::unix(d.dir.join("rtgtd.sock"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(c.request("GET", "/api/v1/ready", None, &[]), Ok(r) if r.status == 200) {
        assert!(
            Instant::now() < deadline,
            "API not ready:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    c
}

/// The status, field and message of a refused request.
fn refused(c: &Client, body: serde_json::Value) -> (u16, String, String) {
    match c.send("POST", "/api/v1/backstores", &body) {
        Err(ClientError::Http {
            status,
            field,
            message,
        }) => (status, field.unwrap_or_default(), message),
        other => panic!("{body} was not refused: {other:?}"),
    }
}

fn backstore_names(c: &Client) -> Vec<String> {
    let list: serde_json::Value = c.get("/api/v1/backstores").unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_string())
        .collect()
}

/// Length, contents, mode and modification time of a file.
fn snapshot(p: &Path) -> (u64, Vec<u8>, u32, i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (
        m.len(),
        std::fs::read(p).unwrap(),
        m.mode(),
        m.mtime(),
        m.mtime_nsec(),
    )
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

struct Scene {
    tmp: tempfile::TempDir,
    root: PathBuf,
    decoy: PathBuf,
}

/// A backstore root `roots/a` and, apart from it, a root-only decoy file.
fn scene() -> Scene {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("roots/a");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir(tmp.path().join("private")).unwrap();
    let decoy = tmp.path().join("private/secret");
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&decoy)
        .unwrap();
    std::fs::write(&decoy, b"root:decoy-hash:19000:0:99999:7:::\n").unwrap();
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o600)).unwrap();
    Scene { tmp, root, decoy }
}

#[test]
fn paths_out_of_the_roots_are_refused_and_left_alone() {
    let s = scene();
    let port = free_port();
    let d = Rtgtd::start("policy-refusals", &config(port, &[&s.root]), port);
    let c = client(&d);
    let before = snapshot(&s.decoy);
    symlink(&s.decoy, s.root.join("abs-link")).unwrap();
    symlink("../../private/secret", s.root.join("rel-link")).unwrap();
    symlink(s.tmp.path().join("private"), s.root.join("dir-link")).unwrap();
    mkfifo(&s.root.join("fifo"));
    let decoy = s.decoy.display().to_string();
    let root = s.root.display().to_string();
    let file =
        |path: &str| serde_json::json!({"name": "x", "type": "file", "path": path, "size": "1MiB"});
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (file(&decoy), "is outside every backstore root"),
        (
            serde_json::json!({"name": "x", "type": "file", "path": decoy}),
            "is outside every backstore root",
        ),
        (
            file(&format!("{root}/abs-link")),
            "leads out of the backstore root",
        ),
        (
            file(&format!("{root}/rel-link")),
            "leads out of the backstore root",
        ),
        (
            file(&format!("{root}/dir-link/secret")),
            "leads out of the backstore root",
        ),
        (
            file(&format!("{root}/../../private/secret")),
            "leads out of the backstore root",
        ),
        (
            file("../../private/secret"),
            "leads out of the backstore root",
        ),
        (
            file(&format!("{root}/fifo")),
            "is not a regular file (a FIFO)",
        ),
        (
            serde_json::json!({"name": "x", "type": "file", "path": "/dev/null"}),
            "/dev/null is outside every backstore root",
        ),
        (
            serde_json::json!({"name": "x", "type": "block", "path": "/dev/null"}),
            "/dev/null is not a block device",
        ),
        (
            serde_json::json!({"name": "x", "type": "block", "path": decoy}),
            "is not a block device (a regular file)",
        ),
    ];
    for (body, rule) in cases {
        let (status, field, message) = refused(&c, body.clone());
        assert_eq!(status, 403, "{body}: {message}");
        assert_eq!(field, "backstores[1].path", "{body}");
        assert!(message.contains(rule), "{body}: {message}");
    }
    let (_, _, message) = refused(&c, file(&decoy));
    assert!(
        message.contains(&root) && message.contains("policy.backstore_roots"),
        "the message names the roots and the setting: {message}"
    );
    assert!(
        message.contains(&d.dir.display().to_string()),
        "the state directory is a root: {message}"
    );

    // Not policy, but refused all the same (422): a missing file without a size, an
    // existing file of another size.
    let (status, field, message) = refused(
        &c,
        serde_json::json!({"name": "x", "type": "file", "path": "none.img"}),
    );
    assert_eq!(
        (status, field.as_str()),
        (422, "backstores[1].path"),
        "{message}"
    );
    assert!(message.contains("does not exist"), "{message}");
    assert!(!d.dir.join("none.img").exists());
    let existing = s.root.join("disk.img");
    std::fs::write(&existing, vec![0x5au8; 674]).unwrap();
    let kept = snapshot(&existing);
    for size in ["1MiB", "512"] {
        let (status, field, message) = refused(
            &c,
            serde_json::json!({"name": "x", "type": "file", "path": existing, "size": size}),
        );
        assert_eq!(
            (status, field.as_str()),
            (422, "backstores[1].size"),
            "{message}"
        );
        assert!(
            message.contains("exists with 674 bytes")
                && message.contains("does not change an existing file"),
            "{message}"
        );
    }
    assert_eq!(snapshot(&existing), kept, "the existing file changed");

    assert_eq!(snapshot(&s.decoy), before, "the decoy changed");
    assert_eq!(backstore_names(&c), ["seed"]);
    assert!(!s.tmp.path().join("private/x").exists());
    let saved = std::fs::read_to_string(d.dir.join("rtgt.yaml")).unwrap();
    assert!(!saved.contains("secret"), "a refused backstore was saved");
}

#[test]
fn files_in_a_root_serve_luns_and_keep_their_size() {
    let s = scene();
    let port = free_port();
    let d = Rtgtd::start("policy-serve", &config(port, &[&s.root]), port);
    let c = client(&d);
    let lun = s.root.join("lun.img");
    c.send(
        "POST",
        "/api/v1/backstores",
        &serde_json::json!({"name": "disk", "type": "file", "path": lun, "size": "8MiB"}),
    )
    .unwrap();
    let meta = std::fs::metadata(&lun).unwrap();
    assert_eq!(meta.len(), 8 << 20);
    assert_eq!(meta.mode() & 0o777, 0o600);
    // A symlink that stays inside the root, and a relative path in the state directory.
    symlink("lun.img", s.root.join("alias.img")).unwrap();
    c.send(
        "POST",
        "/api/v1/backstores",
        &serde_json::json!({"name": "alias", "type": "file", "path": s.root.join("alias.img"), "read_only": true}),
    )
    .unwrap();
    c.send(
        "POST",
        "/api/v1/backstores",
        &serde_json::json!({"name": "local", "type": "file", "path": "local.img", "size": "1MiB"}),
    )
    .unwrap();
    assert_eq!(
        std::fs::metadata(d.dir.join("local.img")).unwrap().len(),
        1 << 20
    );
    let tpg = format!(
        "/api/v1/targets/{}/tpgs/1/luns",
        rtgt_api::client::segment(TEST_IQN)
    );
    c.send(
        "POST",
        &tpg,
        &serde_json::json!({"lun": 1, "backstore": "disk"}),
    )
    .unwrap();
    // An explicit resize still changes the file.
    let mut b: serde_json::Value = c.get("/api/v1/backstores/disk").unwrap();
    b["size"] = serde_json::json!("16MiB");
    c.send("PUT", "/api/v1/backstores/disk", &b).unwrap();
    assert_eq!(std::fs::metadata(&lun).unwrap().len(), 16 << 20);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let capacity = rt.block_on(async {
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        let login = LoginConfig {
            initiator_name: "iqn.2025-01.io.rtgt:policy".into(),
            target_name: Some(TEST_IQN.into()),
            ..LoginConfig::default()
        };
        let s = Session::connect(addr, login).await.unwrap();
        let cdb = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
        let mut r = s.command(1, &cdb, None, 32).await.unwrap();
        for _ in 0..4 {
            if r.is_good() {
                break;
            }
            // Unit attentions of the new LUN and the resize.
            r = s.command(1, &cdb, None, 32).await.unwrap();
        }
        assert!(r.is_good(), "READ CAPACITY(16): {r:?}");
        let d = &r.data;
        (
            u64::from_be_bytes(d[0..8].try_into().unwrap()) + 1,
            u32::from_be_bytes(d[8..12].try_into().unwrap()),
        )
    });
    assert_eq!(capacity, ((16 << 20) / 512, 512));
}

/// rtgtd with `config` in a fresh state directory; returns its exit status and log once it
/// exits (within 30 s).
fn run_to_exit(name: &str, config: &str) -> (std::process::ExitStatus, String) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("rtgt-{name}-"))
        .tempdir()
        .unwrap();
    let file = dir.path().join("rtgt.yaml");
    std::fs::write(&file, format!("{config}rdma: {{enabled: false}}\n")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rtgtd"))
        .arg("--config")
        .arg(&file)
        .arg("--state-dir")
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (status, String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "rtgtd did not exit:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_refused_path_at_start_stops_rtgtd() {
    let s = scene();
    let before = snapshot(&s.decoy);
    let port = free_port();
    let (status, log) = run_to_exit(
        "policy-start",
        &format!(
            "backstores:\n  - {{name: d, type: file, path: '{}', size: 1MiB}}\n\
             targets:\n  - name: {TEST_IQN}\n    portal_groups:\n      - tag: 1\n        portals: ['127.0.0.1:{port}']\n        allow_any_initiator: true\n        luns: [{{lun: 0, backstore: d}}]\n\
             api: {{listen: []}}\n",
            s.decoy.display()
        ),
    );
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("backstore d:") && log.contains("is outside every backstore root"),
        "{log}"
    );
    assert_eq!(snapshot(&s.decoy), before, "the decoy changed");

    // A missing root is warned about, and what lies in it cannot be opened.
    let missing = s.tmp.path().join("not-there");
    let (status, log) = run_to_exit(
        "policy-missing-root",
        &format!(
            "backstores:\n  - {{name: d, type: file, path: '{}/d.img', size: 1MiB}}\n\
             api: {{listen: []}}\npolicy: {{backstore_roots: ['{}']}}\n",
            missing.display(),
            missing.display()
        ),
    );
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("backstore root is missing or read-only for rtgtd")
            && log.contains(&missing.display().to_string()),
        "{log}"
    );
}

/// A loop device over a scratch image, with an ext4 file system; detached (and unmounted)
/// on drop, whatever happened.
struct Loop {
    dev: String,
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl Loop {
    fn new() -> Loop {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(out.status.success(), "losetup: {out:?}");
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let l = Loop {
            dev,
            mount,
            _dir: dir,
        };
        let st = Command::new("mkfs.ext4")
            .args(["-q", &l.dev])
            .status()
            .unwrap();
        assert!(st.success(), "mkfs.ext4 {}", l.dev);
        l
    }

    fn mount(&self) -> bool {
        Command::new("mount")
            .arg(&self.dev)
            .arg(&self.mount)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    fn umount(&self) {
        let _ = Command::new("umount")
            .arg(&self.mount)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.umount();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

#[test]
fn block_devices_must_be_unused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip_or_fail("needs root (loop devices, mount)");
    }
    if !prerequisite("losetup", &["losetup", "--version"])
        || !prerequisite("mkfs.ext4", &["mkfs.ext4", "-V"])
    {
        return;
    }
    let s = scene();
    let port = free_port();
    let d = Rtgtd::start("policy-block", &config(port, &[&s.root]), port);
    let c = client(&d);
    let l = Loop::new();
    let blk = |read_only: bool| serde_json::json!({"name": "blk", "type": "block", "path": l.dev, "read_only": read_only});

    assert!(l.mount(), "mount {}", l.dev);
    for read_only in [false, true] {
        let (status, field, message) = refused(&c, blk(read_only));
        assert_eq!(
            (status, field.as_str()),
            (403, "backstores[1].path"),
            "{message}"
        );
        assert!(
            message.contains(&format!("{} is mounted at {}", l.dev, l.mount.display())),
            "{message}"
        );
    }
    l.umount();

    // Someone else holds it exclusively.
    let excl = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&l.dev)
        .unwrap();
    let (status, _, message) = refused(&c, blk(true));
    assert_eq!(status, 403, "{message}");
    assert!(
        message.contains(&format!(
            "{} is in use (exclusive open refused: EBUSY)",
            l.dev
        )),
        "{message}"
    );
    drop(excl);
    assert_eq!(backstore_names(&c), ["seed"]);

    // Free: it serves, and while it does, nobody can mount it.
    c.send("POST", "/api/v1/backstores", &blk(false)).unwrap();
    assert_eq!(backstore_names(&c), ["seed", "blk"]);
    assert!(!l.mount(), "{} was mounted under rtgtd", l.dev);
    c.delete("/api/v1/backstores/blk").unwrap();
    assert!(
        l.mount(),
        "{} stays claimed after its backstore went",
        l.dev
    );
    l.umount();
}
