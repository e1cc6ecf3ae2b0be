//! Busy polling for the initiators' receive paths: after data arrived, keep trying the
//! socket for a while before sleeping, so the next answer of a busy target costs the target
//! no wake-up of a sleeping initiator. The RDMA initiators get the same from their device
//! runner (`HcaConfig::busy_poll`); this is the TCP one.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, ReadBuf};

/// An [`AsyncRead`] over a socket that, for `budget` after the last data, reads the socket
/// directly (non-blocking) and yields to the runtime between tries instead of waiting for
/// readiness. With a zero budget it is the socket as it is.
pub struct PollingRead<R> {
    inner: R,
    fd: RawFd,
    budget: Duration,
    last_data: Instant,
}

impl<R: AsyncRead + AsRef<tokio::net::TcpStream> + Unpin> PollingRead<R> {
    pub fn new(inner: R, budget: Duration) -> PollingRead<R> {
        let fd = inner.as_ref().as_raw_fd();
        PollingRead {
            inner,
            fd,
            budget,
            last_data: Instant::now(),
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for PollingRead<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.budget.is_zero() && self.last_data.elapsed() < self.budget {
            // The spare capacity is read into as it is (initializing it first would cost a
            // memset of the whole buffer per try).
            // SAFETY: nothing is de-initialized; recv(2) only writes into the slice.
            let room = unsafe { buf.unfilled_mut() };
            // SAFETY: recv(2) writes at most `room.len()` bytes into `room`, memory borrowed
            // for the call; `fd` is the socket `inner` owns.
            let n = unsafe {
                libc::recv(
                    self.fd,
                    room.as_mut_ptr().cast(),
                    room.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                let n = n as usize;
                // SAFETY: recv(2) initialized the first `n` bytes of the unfilled part.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                self.last_data = Instant::now();
                return Poll::Ready(Ok(()));
            }
            let e = io::Error::last_os_error();
            if !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                return Poll::Ready(Err(e));
            }
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.last_data = Instant::now();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    #[tokio::test]
    async fn reads_while_polling_after_the_budget_and_at_end_of_stream() {
        for budget in [Duration::from_secs(5), Duration::ZERO] {
            let (a, mut b) = pair().await;
            let (rd, _wr) = a.into_split();
            let mut r = PollingRead::new(rd, budget);
            let mut buf = [0u8; 8];
            b.write_all(b"abc").await.unwrap();
            let n = r.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"abc");
            // Data that comes later, while polling (or asleep), arrives all the same.
            let late = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                b.write_all(b"defgh").await.unwrap();
                b
            });
            r.read_exact(&mut buf[..5]).await.unwrap();
            assert_eq!(&buf[..5], b"defgh");
            drop(late.await.unwrap());
            assert_eq!(r.read(&mut buf).await.unwrap(), 0, "end of stream");
        }
        // Past the budget it waits for readiness and still gets the data.
        let (a, mut b) = pair().await;
        let (rd, _wr) = a.into_split();
        let mut r = PollingRead::new(rd, Duration::from_millis(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(r.last_data.elapsed() >= r.budget);
        b.write_all(b"xyz").await.unwrap();
        let mut buf = [0u8; 3];
        r.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"xyz");
    }
}
