//! State shared by every connection driver of an iSCSI server (TCP and iSER): the session
//! table, the live connections, logins and session creation or reinstatement (RFC 7143
//! §6.3.5).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtgt_backstore::{BufPool, Latch};

use rtgt_scsi::core::{IscsiParams, Registry};

use super::conn::Conn;
use super::login::{status, LoginContext, LoginOutcome};
use super::params::{SessionType, TransportKind};
use super::session::{CloseReason, Session, SessionSetup, SessionTable};

/// Sessions one server holds at most.
pub const MAX_SESSIONS: usize = 4096;
/// How long a reinstatement waits for the old session to end.
const REINSTATE_WAIT: Duration = Duration::from_secs(10);

/// Waits up to [`REINSTATE_WAIT`] for `old` to end (its devices told of the nexus loss);
/// whether it did.
async fn wait_ended(old: &Session) -> bool {
    let deadline = tokio::time::Instant::now() + REINSTATE_WAIT;
    while !old.has_ended() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    old.has_ended()
}

/// State shared by every connection driver of a server (TCP and iSER).
pub struct ServerShared {
    pub registry: Arc<Registry>,
    pub pool: Arc<BufPool>,
    pub sessions: Arc<SessionTable>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_conn: AtomicU64,
    /// Set when the server stops: no new connections or sessions.
    pub(super) stopping: Latch,
}

impl ServerShared {
    pub fn new(registry: Arc<Registry>, pool: Arc<BufPool>) -> Arc<ServerShared> {
        Arc::new(ServerShared {
            registry,
            pool,
            sessions: SessionTable::new(MAX_SESSIONS),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            stopping: Latch::default(),
        })
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_set()
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
        // An initiator that dropped a connection and logs in again must not meet what its
        // old nexus held (a PREVENT, an SPC-2 reservation) because that connection's task has
        // not yet read the end of its stream: sessions of this initiator whose peer is gone
        // end first.
        for old in self.sessions.of_initiator(&o.initiator_name) {
            if old.peer_closed() {
                old.request_close(CloseReason::Normal);
                wait_ended(&old).await;
            }
        }
        if let Some(old) =
            self.sessions
                .find(&o.initiator_name, &o.isid, &target_name, o.session_type)
        {
            tracing::info!(tsih = old.tsih, initiator = %o.initiator_name, "reinstating iSCSI session");
            old.request_close(CloseReason::Reinstated);
            if !wait_ended(&old).await {
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

    pub(super) fn conns(&self) -> Vec<Arc<Conn>> {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}
