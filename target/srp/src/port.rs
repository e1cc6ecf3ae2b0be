//! The runtime of one SRP target port: logins, the SRP sessions (one per initiator port, the
//! I_T nexus) and their channels.
//!
//! A session lives as long as one of its channels (or a login in progress) does; when the
//! last channel closes, the nexus is lost for every logical unit (SAM-5 I_T nexus loss).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Instant;

use rtgt_backstore::BufPool;
use rtgt_rdma_channel::mem::PoolMrs;
use rtgt_rdma_channel::Endpoint;
use rtgt_rdma_channel::ProviderError;
use rtgt_scsi::core::{srp_port_name, LiveLuns, PortIds, Registry, SrpTargetPort};
use rtgt_scsi::Nexus;

use super::channel::{Channel, CloseReason};
use super::iu::{rej_reason, LoginRej, LoginReq, LoginRsp};
use super::login::{self, ChannelParams, Limits};
use super::nexus::SessionNexus;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static NEXUS_ID: AtomicU64 = AtomicU64::new(1 << 40);

/// The SPC-4 SRP TransportID (7.6.4.5): protocol identifier 4, the initiator port identifier
/// at byte 8, 24 bytes in all.
pub fn transport_id(initiator_port_id: &[u8; 16]) -> Vec<u8> {
    let mut t = vec![0u8; 24];
    t[0] = 0x04;
    t[8..].copy_from_slice(initiator_port_id);
    t
}

/// The I_T nexus of an SRP initiator port and target port `ids`.
pub fn make_nexus(initiator: &[u8; 16], target: &[u8; 16], ids: PortIds) -> Nexus {
    Nexus {
        id: NEXUS_ID.fetch_add(1, Ordering::Relaxed),
        initiator_port: srp_port_name(initiator),
        transport_id: transport_id(initiator),
        target_port: srp_port_name(target),
        relative_port: ids.relative_port,
        port_group: ids.port_group,
    }
}

/// One initiator port logged in to the target port: the I_T nexus, its LUNs, its channels.
pub struct Session {
    /// The nexus and LUN map the channels run their commands against.
    pub shared: Arc<SessionNexus>,
    channels: Mutex<Vec<Weak<Channel>>>,
}

impl std::ops::Deref for Session {
    type Target = SessionNexus;

    fn deref(&self) -> &SessionNexus {
        &self.shared
    }
}

impl Session {
    /// The session's identifier in the administration API and the metrics.
    pub fn id(&self) -> String {
        format!("srp-{}", self.nexus.id)
    }

    /// Live channels.
    pub fn channels(&self) -> Vec<Arc<Channel>> {
        lock(&self.channels)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

/// Snapshot of a session for the daemon's API and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub initiator: String,
    pub target_port: String,
    pub channels: usize,
}

/// A session slot reserved by a successful login; the channel built from it keeps it, and
/// dropping it (a login whose connection never came up, or a closed channel) releases it.
pub struct SessionRef {
    port: Weak<SrpPort>,
    pub session: Arc<Session>,
}

impl SessionRef {
    /// The target port, while it exists.
    pub fn port(&self) -> Option<Arc<SrpPort>> {
        self.port.upgrade()
    }
}

impl Drop for SessionRef {
    fn drop(&mut self) {
        if let Some(port) = self.port.upgrade() {
            port.release(&self.session);
        }
    }
}

/// An accepted login: the LOGIN_RSP to send and what the channel needs.
pub struct Login {
    pub rsp: LoginRsp,
    pub params: ChannelParams,
    pub session: SessionRef,
}

struct Entry {
    session: Arc<Session>,
    /// Channels and logins in progress holding a [`SessionRef`].
    refs: usize,
}

/// The runtime of one SRP target port.
pub struct SrpPort {
    config: RwLock<Arc<SrpTargetPort>>,
    pub limits: Limits,
    pub pool: Arc<BufPool>,
    /// Where sessions record their command metrics.
    registry: Option<Arc<Registry>>,
    me: Weak<SrpPort>,
    sessions: Mutex<HashMap<[u8; 16], Entry>>,
}

impl SrpPort {
    pub fn new(config: Arc<SrpTargetPort>, limits: Limits, pool: Arc<BufPool>) -> Arc<SrpPort> {
        Self::with_registry(config, limits, pool, None)
    }

    /// A port whose sessions record their command metrics in `registry`'s.
    pub fn with_registry(
        config: Arc<SrpTargetPort>,
        limits: Limits,
        pool: Arc<BufPool>,
        registry: Option<Arc<Registry>>,
    ) -> Arc<SrpPort> {
        Arc::new_cyclic(|me| SrpPort {
            config: RwLock::new(config),
            limits,
            pool,
            registry,
            me: me.clone(),
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// The target port's configuration now in force.
    pub fn config(&self) -> Arc<SrpTargetPort> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the configuration (same identifier): new logins see it at once; live
    /// sessions keep their LUN map until [`SrpPort::update_sessions`].
    pub fn set_config(&self, config: Arc<SrpTargetPort>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
    }

    /// Validates a login and reserves its session. A single-channel login closes the
    /// initiator's other channels on this port first.
    pub fn login(&self, req: &LoginReq) -> Result<Login, LoginRej> {
        let config = self.config();
        let port_id = config.port_id();
        let name = srp_port_name(&req.initiator_port_id);
        let existing = self
            .session(&req.initiator_port_id)
            .map_or(0, |s| s.channels().len());
        let params = login::validate(req, &port_id, &self.limits, existing).inspect_err(|r| {
            tracing::warn!(
                initiator = %name, port = %config.name, reason = format_args!("{:#010x}", r.reason),
                "SRP login rejected"
            );
        })?;
        let Some(luns) = config.admit(&name) else {
            tracing::warn!(initiator = %name, port = %config.name, "SRP login rejected: no ACL for this initiator");
            return Err(LoginRej {
                reason: rej_reason::UNABLE_ESTABLISH_CHANNEL,
                tag: req.tag,
                buf_fmt: params.login_rsp(req.tag, false).buf_fmt,
            });
        };
        let mut terminated = false;
        if params.single {
            if let Some(s) = self.session(&req.initiator_port_id) {
                for ch in s.channels() {
                    ch.close(CloseReason::Relogin);
                    terminated = true;
                }
            }
        }
        let session = {
            let mut map = lock(&self.sessions);
            let e = map.entry(req.initiator_port_id).or_insert_with(|| {
                let nexus = make_nexus(&req.initiator_port_id, &port_id, config.ids);
                let labels = vec![
                    ("session", format!("srp-{}", nexus.id)),
                    ("initiator", name.clone()),
                    ("target", config.name.clone()),
                    ("transport", "srp".to_string()),
                ];
                Entry {
                    session: Arc::new(Session {
                        shared: Arc::new(SessionNexus {
                            luns: LiveLuns::new(luns, self.registry.clone(), Some(labels)),
                            nexus,
                            initiator_port_id: req.initiator_port_id,
                            created: Instant::now(),
                        }),
                        channels: Mutex::new(Vec::new()),
                    }),
                    refs: 0,
                }
            });
            e.refs += 1;
            e.session.clone()
        };
        tracing::info!(
            initiator = %name, port = %config.name, it_iu_len = params.it_iu_len,
            req_lim = params.req_lim, immediate = params.imm_data_offset.is_some(),
            single = params.single, "SRP login accepted"
        );
        Ok(Login {
            rsp: params.login_rsp(req.tag, terminated),
            params,
            session: SessionRef {
                port: self.me.clone(),
                session,
            },
        })
    }

    /// Builds the channel of an accepted login on `ep` (made by [`Channel::endpoint`], its
    /// QP now INIT or later) and adds it to its session.
    pub fn start_channel(
        &self,
        ep: Endpoint,
        login: Login,
        peer: SocketAddr,
        pool_mrs: Option<Arc<PoolMrs>>,
    ) -> Result<Arc<Channel>, ProviderError> {
        let session = login.session.session.clone();
        let ch = Channel::start(
            ep,
            login.params,
            login.rsp,
            session.shared.clone(),
            Box::new(login.session),
            self.pool.clone(),
            peer,
            pool_mrs,
        )?;
        let mut v = lock(&session.channels);
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(&ch));
        Ok(ch)
    }

    fn session(&self, initiator: &[u8; 16]) -> Option<Arc<Session>> {
        lock(&self.sessions)
            .get(initiator)
            .map(|e| e.session.clone())
    }

    fn release(&self, session: &Arc<Session>) {
        let gone = {
            let mut map = lock(&self.sessions);
            match map.get_mut(&session.initiator_port_id) {
                Some(e) if Arc::ptr_eq(&e.session, session) => {
                    e.refs -= 1;
                    if e.refs == 0 {
                        map.remove(&session.initiator_port_id);
                        true
                    } else {
                        false
                    }
                }
                _ => false,
            }
        };
        if gone {
            for dev in session.luns.current().map.luns.values() {
                dev.abort_task_set(Some(&session.nexus));
                dev.nexus_loss(&session.nexus);
            }
            tracing::info!(
                initiator = %session.nexus.initiator_port, port = %self.config().name,
                "SRP session ended"
            );
        }
    }

    /// Every session of the port.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .map(|e| e.session.clone())
            .collect()
    }

    pub fn session_info(&self) -> Vec<SessionInfo> {
        self.sessions()
            .iter()
            .map(|s| SessionInfo {
                initiator: s.nexus.initiator_port.clone(),
                target_port: s.nexus.target_port.clone(),
                channels: s.channels().len(),
            })
            .collect()
    }

    /// Every live channel of the port.
    pub fn channels(&self) -> Vec<Arc<Channel>> {
        self.sessions().iter().flat_map(|s| s.channels()).collect()
    }

    /// Tells every initiator the target is going away (SRP_T_LOGOUT) and closes its channels.
    pub async fn shutdown(&self) {
        for ch in self.channels() {
            ch.logout().await;
        }
    }

    /// Gives every session the LUN map the configuration now grants its initiator, with
    /// REPORTED LUNS DATA HAS CHANGED where it changed; logs out (SRP_T_LOGOUT, then a
    /// disconnect) the sessions no longer admitted. Returns what changed: the session id and
    /// whether it was ended (else its map changed).
    pub fn update_sessions(&self) -> Vec<(String, bool)> {
        let config = self.config();
        let mut out = Vec::new();
        for s in self.sessions() {
            let Some(map) = config.admit(&s.nexus.initiator_port) else {
                tracing::info!(
                    initiator = %s.nexus.initiator_port, port = %config.name,
                    "SRP session no longer admitted: logging it out"
                );
                logout_all(s.channels());
                out.push((s.id(), true));
                continue;
            };
            if s.luns.remap(&s.nexus, map) {
                out.push((s.id(), false));
            }
        }
        out
    }

    /// Logs out the session `id` (SRP_T_LOGOUT on each channel, then a disconnect).
    /// Returns whether the port had it.
    pub fn logout_session(&self, id: &str) -> bool {
        let Some(s) = self.sessions().into_iter().find(|s| s.id() == id) else {
            return false;
        };
        logout_all(s.channels());
        true
    }
}

/// SRP_T_LOGOUT and a disconnect on each of `channels`, in the background.
pub fn logout_all(channels: Vec<Arc<Channel>>) {
    if channels.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for ch in channels {
            ch.logout().await;
        }
    });
}
