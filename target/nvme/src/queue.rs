//! What every transport's queue shares: which subsystems a listener serves, the Connect that
//! opens a queue, the submission queue head the completions report, and the transport's name.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use crate::ctrl::Controller;
use crate::fabrics::{ConnectData, FabricsCmd, CONNECT_DATA_LEN};
use crate::sqe::{sc, sct, Cqe, Sqe, Status};
use crate::subsys::{ConnectRefused, Targets, DISCOVERY_NQN};

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every subsystem the host is admitted to, and discovery: the port with this ID.
    Port(u16),
    /// Only the discovery subsystem (a discovery listener, e.g. TCP port 8009).
    Discovery,
}

/// The transport a queue runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Rdma,
}

impl Transport {
    /// As the API and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "nvme-tcp",
            Transport::Rdma => "nvme-rdma",
        }
    }
}

/// Connect's CATTR bit: the host disables SQ flow control (SQ head pointer reports).
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

/// The fields of a Connect command a transport needs before its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCmd {
    pub qid: u16,
    /// Zero based.
    pub sqsize: u16,
    /// Keep alive timeout, milliseconds.
    pub kato: u32,
    pub cattr: u8,
}

impl ConnectCmd {
    /// The Connect in `sqe`; any other command before it is a command sequence error.
    pub fn parse(sqe: &Sqe) -> Result<ConnectCmd, Status> {
        match FabricsCmd::parse(sqe) {
            Some(FabricsCmd::Connect {
                qid,
                sqsize,
                kato,
                cattr,
                ..
            }) => Ok(ConnectCmd {
                qid,
                sqsize,
                kato,
                cattr,
            }),
            _ => Err(Status::error(sct::GENERIC, sc::COMMAND_SEQUENCE_ERROR)),
        }
    }

    /// Whether the host disabled SQ flow control.
    pub fn sqflow_disabled(&self) -> bool {
        self.cattr & CATTR_DISABLE_SQFLOW != 0
    }

    /// Admits the queue with Connect's `data` through a listener serving `scope`: the
    /// controller it creates (admin queue) or joins (I/O queue), or why not (completion
    /// status and DW0). Refusals are logged with the host's names.
    pub fn admit(
        &self,
        targets: &Targets,
        scope: Scope,
        data: &[u8],
        transport: Transport,
    ) -> Result<Arc<Controller>, ConnectRefused> {
        if data.len() != CONNECT_DATA_LEN {
            return Err(ConnectRefused {
                status: Status::error(sct::GENERIC, sc::SGL_INVALID_DATA_LENGTH),
                dw0: 0,
            });
        }
        let cd = ConnectData::parse(data).map_err(|bad| ConnectRefused {
            status: Status::error(
                sct::COMMAND_SPECIFIC,
                crate::fabrics::status::CONNECT_INVALID_PARAMETERS,
            ),
            dw0: u32::from(bad.0),
        })?;
        let r = if scope == Scope::Discovery && cd.subsys_nqn != DISCOVERY_NQN {
            Err(ConnectRefused::unknown_subsystem())
        } else {
            let port = match scope {
                Scope::Port(id) => Some(id),
                Scope::Discovery => None,
            };
            targets.connect(self.qid, self.sqsize, self.kato, &cd, port)
        };
        if let Err(refused) = &r {
            tracing::warn!(host = %cd.host_nqn, subsystem = %cd.subsys_nqn, qid = self.qid,
                status = ?refused.status, transport = transport.name(), "NVMe connect refused");
        }
        r
    }
}

/// A submission queue's head as completions report it: one entry consumed per command
/// fetched.
#[derive(Debug)]
pub struct SqHead {
    head: AtomicU16,
    size: u16,
}

impl SqHead {
    /// The head of a queue of `size` entries after its Connect was fetched.
    pub fn new(size: u16) -> SqHead {
        SqHead {
            head: AtomicU16::new(1 % size.max(1)),
            size: size.max(1),
        }
    }

    /// The queue's entries.
    pub fn size(&self) -> u16 {
        self.size
    }

    /// One more entry fetched.
    pub fn fetched(&self) {
        let next = (self.head.load(Ordering::Relaxed) + 1) % self.size;
        self.head.store(next, Ordering::Relaxed);
    }

    /// The completion of command `cid` on queue `qid`.
    pub fn cqe(&self, qid: u16, cid: u16, status: Status, dw0: u32, dw1: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            sq_head: self.head.load(Ordering::Relaxed),
            sq_id: qid,
            cid,
            status,
            phase: false,
        }
    }
}
