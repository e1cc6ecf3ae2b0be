//! The iSCSI target server: accepts TCP connections, creates and reinstates sessions
//! (RFC 7143 §6.3.5), and offers the daemon its controls (session list, forced logout,
//! graceful shutdown with Async logout requests, §11.9.1).

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtgt_backstore::BufPool;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use rtgt_scsi::core::Registry;

use super::conn::Conn;
use super::params::SessionType;
use super::session::{CloseReason, SessionInfo};
pub use super::shared::{ServerShared, MAX_SESSIONS};

/// The iSCSI/TCP target server.
#[derive(Clone)]
pub struct IscsiServer {
    shared: Arc<ServerShared>,
    conn_tasks: Arc<Mutex<JoinSet<()>>>,
}

impl IscsiServer {
    pub fn new(registry: Arc<Registry>, pool: Arc<BufPool>) -> Self {
        IscsiServer {
            shared: ServerShared::new(registry, pool),
            conn_tasks: Arc::new(Mutex::new(JoinSet::new())),
        }
    }

    /// State for other connection drivers (iSER) that share sessions with this server.
    pub fn shared(&self) -> Arc<ServerShared> {
        self.shared.clone()
    }

    /// Accepts connections until `shutdown` turns true (or [`IscsiServer::shutdown`] runs).
    pub async fn serve(
        &self,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<()> {
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            tokio::select! {
                _ = self.shared.stopping.wait() => return Ok(()),
                r = listener.accept() => {
                    let (stream, peer) = match r {
                        Ok(x) => x,
                        Err(e) => {
                            // Out of descriptors and the like: back off instead of spinning.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    if self.shared.is_stopping() {
                        return Ok(());
                    }
                    tracing::debug!(%peer, "iSCSI connection accepted");
                    let shared = self.shared.clone();
                    let mut tasks = self.conn_tasks.lock().unwrap_or_else(|e| e.into_inner());
                    while tasks.try_join_next().is_some() {}
                    tasks.spawn(super::conn_tcp::serve_connection(shared, stream));
                }
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Stops accepting, asks every session to log out within `grace` (Async Message
    /// event 1), then closes what is left, aborting commands still in flight.
    pub async fn shutdown(&self, grace: Duration) {
        self.shared.stopping.set();
        let secs = grace.as_secs().clamp(1, u16::MAX as u64) as u16;
        for c in self.shared.conns() {
            if c.session.session_type == SessionType::Normal {
                let _ = c.request_logout(secs).await;
            } else {
                c.session.request_close(CloseReason::Shutdown);
            }
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.shared.sessions.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for s in self.shared.sessions.all() {
            s.request_close(CloseReason::Shutdown);
        }
        let mut tasks =
            std::mem::take(&mut *self.conn_tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let drain = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            tracing::warn!("iSCSI connections did not finish in time");
        }
    }

    /// The live sessions.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        self.shared
            .sessions
            .all()
            .iter()
            .map(|s| s.info())
            .collect()
    }

    /// Drops a session at once, announcing it with Async Message event 3. Returns whether
    /// the session existed.
    pub fn force_logout(&self, tsih: u16) -> bool {
        let Some(session) = self.shared.sessions.get(tsih) else {
            return false;
        };
        let conns: Vec<Arc<Conn>> = self
            .shared
            .conns()
            .into_iter()
            .filter(|c| Arc::ptr_eq(&c.session, &session))
            .collect();
        let wait = session.params.default_time2wait;
        tokio::spawn(async move {
            for c in conns {
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), c.announce_drop(wait, 0)).await;
                c.driver.close();
            }
            session.request_close(CloseReason::Forced);
        });
        true
    }
}
