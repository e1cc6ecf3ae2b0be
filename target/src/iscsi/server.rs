//! The iSCSI target server: accepts TCP connections, creates and reinstates sessions
//! (RFC 7143 §6.3.5), and offers the daemon its controls (session list, forced logout,
//! graceful shutdown with Async logout requests, §11.9.1).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtgt_backstore::BufPool;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::core::{IscsiParams, Registry};

use super::conn::Conn;
use super::login::{status, LoginContext, LoginOutcome};
use super::params::{SessionType, TransportKind};
use super::session::{CloseReason, Session, SessionInfo, SessionSetup, SessionTable};

/// Sessions one server holds at most.
pub const MAX_SESSIONS: usize = 4096;
/// How long a reinstatement waits for the old session to end.
const REINSTATE_WAIT: Duration = Duration::from_secs(10);

/// State shared by every connection driver of a server (TCP and iSER).
pub struct ServerShared {
    pub registry: Arc<Registry>,
    pub pool: Arc<BufPool>,
    pub sessions: Arc<SessionTable>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_conn: AtomicU64,
    stopping: AtomicBool,
    stop: tokio::sync::Notify,
}

impl ServerShared {
    pub fn new(registry: Arc<Registry>, pool: Arc<BufPool>) -> Arc<ServerShared> {
        Arc::new(ServerShared {
            registry,
            pool,
            sessions: SessionTable::new(MAX_SESSIONS),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            stop: tokio::sync::Notify::new(),
        })
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// The context a login on a new connection runs in.
    pub fn login_context(
        &self,
        local: SocketAddr,
        peer: SocketAddr,
        transport: TransportKind,
    ) -> LoginContext {
        let sessions = self.sessions.clone();
        LoginContext {
            registry: self.registry.clone(),
            local,
            peer,
            transport,
            session_exists: Arc::new(move |tsih| sessions.contains(tsih)),
        }
    }

    /// Creates the session for a successful login, closing the session it reinstates
    /// first (same initiator, ISID and target with TSIH 0, RFC 7143 §6.3.5). Returns the
    /// login status on failure.
    pub async fn establish(
        &self,
        o: LoginOutcome,
        transport: TransportKind,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<Arc<Session>, u16> {
        if self.is_stopping() {
            return Err(status::SERVICE_UNAVAILABLE);
        }
        let target_name = o.params.target_name.clone();
        if let Some(old) =
            self.sessions
                .find(&o.initiator_name, &o.isid, &target_name, o.session_type)
        {
            tracing::info!(tsih = old.tsih, initiator = %o.initiator_name, "reinstating iSCSI session");
            old.request_close(CloseReason::Reinstated);
            let deadline = tokio::time::Instant::now() + REINSTATE_WAIT;
            while !old.has_ended() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !old.has_ended() {
                tracing::warn!(tsih = old.tsih, "old session did not end in time");
                return Err(status::SERVICE_UNAVAILABLE);
            }
        }
        let params: IscsiParams = o
            .portal_group
            .as_ref()
            .map(|g| g.params.clone())
            .unwrap_or_default();
        let queue_depth = match o.session_type {
            SessionType::Normal => params.queue_depth.max(1),
            SessionType::Discovery => 4,
        };
        let setup = SessionSetup {
            isid: o.isid,
            session_type: o.session_type,
            params: o.params,
            luns: o.luns,
            exp_cmd_sn: o.cmd_sn,
            queue_depth,
            transport,
            peer,
            local,
            registry: self.registry.clone(),
            pool: self.pool.clone(),
            nopin_interval: params.nopin_interval,
            nopin_timeout: params.nopin_timeout,
            busy_poll_micros: params.busy_poll_micros,
            zero_copy_reads: params.zero_copy_reads,
        };
        self.sessions.create(setup).ok_or(status::OUT_OF_RESOURCES)
    }

    /// Makes a connection in full feature phase reachable for shutdown and forced logout.
    pub fn register_conn(&self, c: Arc<Conn>) -> u64 {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, c);
        id
    }

    pub fn unregister_conn(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    fn conns(&self) -> Vec<Arc<Conn>> {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

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
            let stop = self.shared.stop.notified();
            tokio::pin!(stop);
            stop.as_mut().enable();
            if *shutdown.borrow() || self.shared.is_stopping() {
                return Ok(());
            }
            tokio::select! {
                _ = stop => return Ok(()),
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
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.stop.notify_waiters();
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
