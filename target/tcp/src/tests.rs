//! The outbox on a Unix socket pair: framing order, every kind of data, a full socket,
//! batches, closing, and a file range that ends early.

use std::io::Write;
use std::sync::atomic::AtomicU64;

use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;

use super::*;

/// Heads carry the sequence number the framer gave them, tails the data length.
#[derive(Default)]
struct Numbered {
    sent: AtomicU64,
}

impl Framer for Numbered {
    type Pdu = TxData;
    type Seq = u32;

    fn data_len(pdu: &TxData) -> usize {
        pdu.len()
    }

    fn frame(&self, seq: &mut u32, pdus: &mut Vec<TxData>, wires: &mut VecDeque<Wire>) {
        for d in pdus.drain(..) {
            let head = seq.to_be_bytes();
            *seq += 1;
            let tail = (d.len() as u32).to_be_bytes();
            wires.push_back(Wire::new(&head, d, &tail));
        }
    }

    fn sent(&self, pdus: usize) {
        self.sent.fetch_add(pdus as u64, Ordering::Relaxed);
    }
}

/// What the peer should read for `data` framed as number `seq`.
fn expect(seq: u32, data: &[u8]) -> Vec<u8> {
    let mut v = seq.to_be_bytes().to_vec();
    v.extend_from_slice(data);
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[derive(Debug)]
struct Span {
    file: std::fs::File,
    offset: u64,
    len: u64,
}

impl FileSpan for Span {
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
    fn offset(&self) -> u64 {
        self.offset
    }
    fn len(&self) -> u64 {
        self.len
    }
}

/// A file holding `content`, as a span of `len` bytes at `offset`.
fn span(content: &[u8], offset: u64, len: u64) -> Arc<dyn FileSpan> {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(content).unwrap();
    Arc::new(Span {
        file: f,
        offset,
        len,
    })
}

fn outbox(slots: usize) -> (Arc<Outbox<Numbered>>, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    let (_, wr) = a.into_split();
    (Arc::new(Outbox::new(Numbered::default(), wr, 0, slots)), b)
}

#[tokio::test]
async fn every_kind_of_data_goes_out_in_order() {
    let (out, mut peer) = outbox(64);
    let writer = tokio::spawn(out.clone().run_writer());
    let file = pattern(300_000, 7);
    let buf = Arc::new(IoBuf::from_slice(&pattern(70_000, 3)));
    let pdus = [
        TxData::Empty,
        TxData::Bytes(Bytes::from_static(b"hello")),
        TxData::Buf(buf.clone(), 5..65_541),
        TxData::File {
            range: span(&file, 1000, 250_000),
            start: 4,
            len: 200_000,
        },
        TxData::Bytes(Bytes::from_static(b"after the file")),
        TxData::File {
            range: span(&file, 0, 512),
            start: 0,
            len: 512,
        },
        TxData::Owned(IoBuf::from_slice(&pattern(9000, 4)), 8192),
    ];
    let mut want = Vec::new();
    for (i, d) in pdus.iter().enumerate() {
        let bytes = match (i, d) {
            // The span starts at 1000, the data 4 bytes into it.
            (3, TxData::File { len, .. }) => file[1004..1004 + len].to_vec(),
            (_, TxData::File { len, .. }) => file[..*len].to_vec(),
            _ => d.as_slice().to_vec(),
        };
        want.extend(expect(i as u32, &bytes));
    }
    let sender = {
        let out = out.clone();
        tokio::spawn(async move {
            for d in pdus {
                out.send(d).await.unwrap();
            }
            out.close();
        })
    };
    let mut got = Vec::new();
    peer.read_to_end(&mut got).await.unwrap();
    sender.await.unwrap();
    writer.await.unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "bytes differ");
    assert_eq!(out.framer().sent.load(Ordering::Relaxed), 7);
    assert!(out.is_idle());
}

/// More than the socket holds and more PDUs than slots: senders wait, the writer task
/// writes as the peer reads, and everything arrives in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_socket_and_full_slots_hold_senders_back() {
    let (out, mut peer) = outbox(4);
    let writer = tokio::spawn(out.clone().run_writer());
    let data = Arc::new(IoBuf::from_slice(&pattern(256 << 10, 9)));
    let sender = {
        let out = out.clone();
        let data = data.clone();
        tokio::spawn(async move {
            for _ in 0..64 {
                out.send(TxData::Buf(data.clone(), 0..data.len()))
                    .await
                    .unwrap();
            }
            out.close();
        })
    };
    let one = expect(0, data.as_slice()).len();
    let mut got = vec![0u8; one];
    for i in 0..64u32 {
        // A slow peer.
        tokio::task::yield_now().await;
        peer.read_exact(&mut got).await.unwrap();
        assert!(got == expect(i, data.as_slice()), "PDU {i} differs");
    }
    let mut rest = Vec::new();
    peer.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    sender.await.unwrap();
    writer.await.unwrap();
}

/// In a batch nothing is written until the batch ends (or fills).
#[tokio::test]
async fn a_batch_goes_out_when_it_ends() {
    let (out, peer) = outbox(64);
    out.begin_batch();
    for _ in 0..BATCH_FLUSH - 1 {
        out.send(TxData::Bytes(Bytes::from_static(b"x")))
            .await
            .unwrap();
    }
    let mut b = [0u8; 1024];
    assert_eq!(
        peer.try_read(&mut b).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    out.end_batch();
    peer.readable().await.unwrap();
    let n = peer.try_read(&mut b).unwrap();
    assert_eq!(n, (BATCH_FLUSH - 1) * 9);
    // A full batch goes at once.
    out.begin_batch();
    for _ in 0..BATCH_FLUSH {
        out.send(TxData::Empty).await.unwrap();
    }
    peer.readable().await.unwrap();
    assert_eq!(peer.try_read(&mut b).unwrap(), BATCH_FLUSH * 8);
}

/// A closed outbox takes nothing more; what was queued still goes, then end of stream.
#[tokio::test]
async fn closing_sends_what_is_queued_then_ends_the_stream() {
    let (out, mut peer) = outbox(64);
    out.begin_batch();
    out.send(TxData::Bytes(Bytes::from_static(b"queued")))
        .await
        .unwrap();
    out.close();
    assert_eq!(out.send(TxData::Empty).await, Err(Closed));
    tokio::spawn(out.clone().run_writer()).await.unwrap();
    let mut got = Vec::new();
    peer.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, expect(0, b"queued"));
}

/// A file shorter than its range: the data cannot go out in full, so the outbox closes and
/// the peer sees the stream end before the PDU's tail.
#[tokio::test]
async fn a_file_range_past_the_end_closes_the_outbox() {
    let (out, mut peer) = outbox(64);
    let writer = tokio::spawn(out.clone().run_writer());
    let content = pattern(1000, 1);
    out.send(TxData::File {
        range: span(&content, 0, 4000),
        start: 0,
        len: 4000,
    })
    .await
    .unwrap_err();
    assert!(out.is_closing());
    writer.await.unwrap();
    let mut got = Vec::new();
    peer.read_to_end(&mut got).await.unwrap();
    assert_eq!(got[..4], 0u32.to_be_bytes());
    assert!(got.len() < 4 + 4000 + 4, "{} bytes", got.len());
}
