//! The rbd backstore against a real one-node cluster (`tests/ceph/cluster.sh`): data written
//! through it is what `rbd export` reads, COMPARE AND WRITE is librbd's, capacity changes made
//! by `rbd resize` arrive, and an unreachable cluster ends operations with NOT READY's error
//! class within the configured time, after which service resumes.

use std::sync::Arc;
use std::time::Duration;

use rtgt_backstore::{Backstore, BackstoreError, IoBuf, IoErrorKind, SharedState};
use rtgt_ceph::{ClusterSpec, RadosState, RbdBackstore, RbdOptions};

#[path = "../../tests/ceph/mod.rs"]
mod cluster;
#[path = "../../transport/src/test_support.rs"]
mod test_support;

use cluster::TestCluster;

fn options(c: &TestCluster, image: &str, timeout: u64) -> RbdOptions {
    RbdOptions {
        cluster: ClusterSpec {
            conf: c.conf().to_path_buf(),
            client_id: "admin".into(),
            keyring: None,
            op_timeout: Duration::from_secs(timeout),
        },
        pool: "rbd".into(),
        namespace: String::new(),
        image: image.into(),
        block_size: 512,
        read_only: false,
        write_cache: true,
        thin: true,
    }
}

fn cluster() -> Option<TestCluster> {
    match TestCluster::start() {
        Ok(c) => Some(c),
        Err(e) => {
            test_support::skip_or_fail(e);
            None
        }
    }
}

async fn open(opts: RbdOptions) -> Arc<RbdBackstore> {
    tokio::task::spawn_blocking(move || RbdBackstore::open(&opts))
        .await
        .unwrap()
        .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_writes_compares_and_resizes_an_image() {
    let Some(c) = cluster() else { return };
    c.create_image("disk", 8);
    let store = open(options(&c, "disk", 30)).await;
    let info = store.info();
    assert_eq!((info.block_size, info.num_blocks), (512, 8 << 11));
    assert_eq!(store.compare_and_write_limit(), 512);

    // Writes land where `rbd export` finds them; reads return them.
    let a = pattern(64 << 10, 1);
    let (r, _) = store.write(1 << 20, IoBuf::from_slice(&a), false).await;
    r.unwrap();
    let b = pattern(4096, 2);
    let (r, _) = store.write(8192, IoBuf::from_slice(&b), true).await;
    r.unwrap();
    store.flush().await.unwrap();
    let image = c.export("disk");
    assert_eq!(image.len(), 8 << 20);
    assert_eq!(&image[1 << 20..(1 << 20) + a.len()], &a[..]);
    assert_eq!(&image[8192..8192 + 4096], &b[..]);
    let (r, buf) = store.read(1 << 20, IoBuf::zeroed(a.len())).await;
    r.unwrap();
    assert_eq!(buf.as_slice(), &a[..]);
    // Allocation by RADOS object (4 MiB): the first exists, the second was never written.
    assert_eq!(store.lba_status(0, 8 << 20).await.unwrap(), (true, 4 << 20));
    assert_eq!(
        store.lba_status(5 << 20, 1 << 20).await.unwrap(),
        (false, 1 << 20)
    );
    assert_eq!(
        store.lba_status(1 << 20, 7 << 20).await.unwrap(),
        (true, 3 << 20)
    );

    // COMPARE AND WRITE: written when equal; otherwise the first difference, nothing written.
    let new = pattern(512, 3);
    let mut both = b[..512].to_vec();
    both.extend_from_slice(&new);
    let (r, _) = store
        .compare_and_write(8192, IoBuf::from_slice(&both), false)
        .await;
    assert_eq!(r.unwrap(), None);
    let mut stale = new.clone();
    stale[100] ^= 0xff;
    stale.extend_from_slice(&pattern(512, 4));
    let (r, _) = store
        .compare_and_write(8192, IoBuf::from_slice(&stale), false)
        .await;
    assert_eq!(r.unwrap(), Some(100));
    let (r, buf) = store.read(8192, IoBuf::zeroed(4096)).await;
    r.unwrap();
    assert_eq!(&buf[..512], &new[..], "the miscompare wrote nothing");
    assert_eq!(&buf[512..], &b[512..]);

    // Zeroes and discards read back as zeroes.
    store.write_zeroes(1 << 20, 4096, false).await.unwrap();
    store.unmap((1 << 20) + 8192, 8192).await.unwrap();
    let (r, buf) = store.read(1 << 20, IoBuf::zeroed(a.len())).await;
    r.unwrap();
    let mut want = a.clone();
    want[..4096].fill(0);
    want[8192..16384].fill(0);
    let zeroes: Vec<usize> = (0..a.len() / 512)
        .filter(|i| buf[i * 512..(i + 1) * 512].iter().all(|&b| b == 0))
        .collect();
    assert!(buf.as_slice() == &want[..], "zero sectors: {zeroes:?}");

    // Out of range: refused before librbd sees it.
    let (r, _) = store.read(8 << 20, IoBuf::zeroed(512)).await;
    assert_eq!(r.unwrap_err().kind(), IoErrorKind::OutOfRange);

    // A command that goes away leaves its buffer to the operation.
    for _ in 0..16 {
        let read = store.read(0, IoBuf::zeroed(1 << 20));
        let _ = tokio::time::timeout(Duration::from_micros(1), read).await;
    }
    let (r, _) = store.read(0, IoBuf::zeroed(512)).await;
    r.unwrap();

    // Resized by the cluster's tools: the new capacity arrives through the header watch.
    let mut sizes = store.capacity_changes().unwrap();
    c.rbd(&["resize", "--size", "16M", "rbd/disk"]);
    tokio::time::timeout(Duration::from_secs(30), sizes.changed())
        .await
        .expect("the resize is noticed")
        .unwrap();
    assert_eq!(*sizes.borrow(), 16 << 11);
    assert_eq!(store.info().num_blocks, 16 << 11);
    // And by the backstore itself, which the cluster then reports.
    store.resize(24 << 11).await.unwrap();
    assert_eq!(store.info().num_blocks, 24 << 11);
    let info = String::from_utf8(c.rbd(&["info", "--format", "json", "rbd/disk"])).unwrap();
    assert!(
        info.contains(&format!("\"size\":{}", 24u64 << 20)),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_not_ready_and_service_resumes() {
    let Some(c) = cluster() else { return };
    c.create_image("disk", 4);
    let store = open(options(&c, "disk", 3)).await;
    let (r, _) = store.write(0, IoBuf::from_slice(&[7u8; 4096]), false).await;
    r.unwrap();

    c.pause(true);
    // The bound is the configured 3 s; a hang would be caught by this outer limit.
    let write = store.write(4096, IoBuf::from_slice(&[8u8; 4096]), false);
    let (r, _) = tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the write ends while the cluster is unreachable");
    let e: BackstoreError = r.unwrap_err();
    assert_eq!(e.kind(), IoErrorKind::NotReady, "{e}");
    let read = store.read(0, IoBuf::zeroed(4096));
    let (r, _) = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the read ends while the cluster is unreachable");
    assert_eq!(r.unwrap_err().kind(), IoErrorKind::NotReady);

    c.pause(false);
    let (r, _) = store
        .write(4096, IoBuf::from_slice(&[9u8; 4096]), false)
        .await;
    r.unwrap();
    let (r, buf) = store.read(0, IoBuf::zeroed(8192)).await;
    r.unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 7));
    assert!(buf[4096..].iter().all(|&b| b == 9));
}

#[tokio::test]
async fn a_missing_image_or_pool_is_named() {
    let Some(c) = cluster() else { return };
    let opts = options(&c, "nowhere", 10);
    let e = tokio::task::spawn_blocking(move || RbdBackstore::open(&opts).err())
        .await
        .unwrap()
        .expect("no such image");
    assert_eq!(e.errno(), Some(libc::ENOENT), "{e}");
    assert!(e.to_string().contains("rbd/nowhere"), "{e}");
    let mut opts = options(&c, "x", 10);
    opts.pool = "nopool".into();
    let e = tokio::task::spawn_blocking(move || RbdBackstore::open(&opts).err())
        .await
        .unwrap()
        .expect("no such pool");
    assert!(e.to_string().contains("\"nopool\""), "{e}");
}

fn spec(c: &TestCluster, timeout: u64) -> ClusterSpec {
    options(c, "", timeout).cluster
}

async fn state(c: &TestCluster, timeout: u64, object: &str) -> RadosState {
    let (spec, object) = (spec(c, timeout), object.to_string());
    tokio::task::spawn_blocking(move || RadosState::open(&spec, "rbd", "", &object))
        .await
        .unwrap()
        .unwrap()
}

/// Two gateways' handles on one RADOS state object: a change through one is known to the
/// other when the update returns; concurrent updates all land (none lost to a race); an
/// unreachable cluster is an error of the NOT READY class, and the handles recover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_shared_through_rados() {
    let Some(c) = cluster() else { return };
    // Separate connections, as two processes have: another client id each.
    let a = state(&c, 3, "rtgt.pr.disk").await;
    let mut other = spec(&c, 3);
    other.client_id = "gw2".into();
    let b = {
        let other = other.clone();
        tokio::task::spawn_blocking(move || RadosState::open(&other, "rbd", "", "rtgt.pr.disk"))
            .await
            .unwrap()
            .unwrap()
    };
    assert!(a.maybe_changed().unwrap(), "nothing read yet");
    assert_eq!(a.read().await.unwrap(), b"");
    assert_eq!(b.read().await.unwrap(), b"");
    assert!(!a.maybe_changed().unwrap() && !b.maybe_changed().unwrap());

    a.update(&mut |cur| {
        assert_eq!(cur, b"");
        Some(b"1".to_vec())
    })
    .await
    .unwrap();
    // The notification was acknowledged by B before the update returned.
    assert!(b.maybe_changed().unwrap());
    assert_eq!(b.read().await.unwrap(), b"1");
    assert!(!b.maybe_changed().unwrap());
    // Declining changes nothing and tells nobody.
    b.update(&mut |_| None).await.unwrap();
    assert!(!b.maybe_changed().unwrap());

    // Counters incremented from both handles at once: every increment lands.
    let (a, b) = (Arc::new(a), Arc::new(b));
    let bump = |s: Arc<RadosState>| async move {
        for _ in 0..20 {
            s.update(&mut |cur| {
                let n: u64 = std::str::from_utf8(cur).unwrap().parse().unwrap();
                Some((n + 1).to_string().into_bytes())
            })
            .await
            .unwrap();
        }
    };
    tokio::join!(bump(a.clone()), bump(b.clone()));
    assert_eq!(a.read().await.unwrap(), b"41");
    assert_eq!(b.read().await.unwrap(), b"41");

    // Out of reach: reads and updates fail within the operation timeout, as NOT READY.
    c.pause(true);
    let e = a.read().await.unwrap_err();
    assert_eq!(
        rtgt_backstore::errno_kind(&e, false),
        IoErrorKind::NotReady,
        "{e}"
    );
    a.update(&mut |_| Some(b"x".to_vec()))
        .await
        .map(|()| panic!("an update with the cluster paused"))
        .unwrap_or_else(|e| {
            assert_eq!(
                rtgt_backstore::errno_kind(&e, true),
                IoErrorKind::NotReady,
                "{e}"
            )
        });
    c.pause(false);
    b.update(&mut |cur| Some([cur, b"+"].concat()))
        .await
        .unwrap();
    assert!(a.maybe_changed().unwrap());
    assert_eq!(a.read().await.unwrap(), b"41+");
}

/// A gateway that listens for changes holds the changing gateway's update until it has
/// dealt with the change and acknowledged it; its own changes do not wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_acknowledges_changes_after_dealing_with_them() {
    let Some(c) = cluster() else { return };
    let a = Arc::new(state(&c, 10, "rtgt.pr.listen").await);
    let mut other = spec(&c, 10);
    other.client_id = "gw2".into();
    let b = Arc::new(
        tokio::task::spawn_blocking(move || RadosState::open(&other, "rbd", "", "rtgt.pr.listen"))
            .await
            .unwrap()
            .unwrap(),
    );
    let listener = {
        let b = b.clone();
        tokio::spawn(async move { b.next_change().await })
    };
    // Until B listens, its notifications are acknowledged at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    // B's own change does not wake B.
    b.update(&mut |_| Some(b"b".to_vec())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!listener.is_finished(), "woken by its own change");
    let update = {
        let a = a.clone();
        tokio::spawn(async move { a.update(&mut |_| Some(b"a".to_vec())).await })
    };
    assert!(listener.await.unwrap(), "no change announced");
    assert!(b.maybe_changed().unwrap());
    // A's update waits for B's acknowledgement.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !update.is_finished(),
        "the update returned before B acknowledged"
    );
    assert_eq!(b.read().await.unwrap(), b"a");
    b.acknowledge();
    tokio::time::timeout(Duration::from_secs(5), update)
        .await
        .expect("the update still waits after the acknowledgement")
        .unwrap()
        .unwrap();
}

/// The cluster blocklists the gateway's client (as when another client broke its lock after
/// losing touch with it): the next command finds it out, the gateway connects again and the
/// command goes through on the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocklisted_gateway_connects_again() {
    let Some(c) = cluster() else { return };
    c.create_image("disk", 8);
    let store = open(options(&c, "disk", 10)).await;
    let (r, _) = store.write(0, IoBuf::from_slice(&[1u8; 4096]), false).await;
    r.unwrap();
    let status = String::from_utf8(c.rbd(&["status", "--format", "json", "rbd/disk"])).unwrap();
    let addr = status
        .split("\"address\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("a watcher in {status}"))
        .to_string();
    let mut tries = 0;
    loop {
        let out = std::process::Command::new("ceph")
            .arg("-c")
            .arg(c.conf())
            .args(["osd", "blocklist", "add", &addr])
            .output()
            .unwrap();
        tries += 1;
        if out.status.success() {
            break;
        }
        // The monitor may be busy with the previous map change on a loaded machine.
        assert!(tries < 5, "{}", String::from_utf8_lossy(&out.stderr));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let write = store.write(4096, IoBuf::from_slice(&[2u8; 4096]), false);
    let (r, _) = tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the write ends");
    r.unwrap();
    let (r, buf) = store.read(0, IoBuf::zeroed(8192)).await;
    r.unwrap();
    assert!(buf[..4096].iter().all(|&x| x == 1) && buf[4096..].iter().all(|&x| x == 2));
    let status = String::from_utf8(c.rbd(&["status", "--format", "json", "rbd/disk"])).unwrap();
    assert!(
        !status.contains(&addr),
        "a new client watches the image: {status}"
    );
}
