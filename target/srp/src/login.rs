//! Login validation (SRP r16a §6.2–6.4): a LOGIN_REQ either becomes the parameters of a new
//! channel and the LOGIN_RSP that announces them, or a LOGIN_REJ with the reason.
//!
//! The checks follow Linux ib_srpt where the standard leaves room: a target port identifier
//! that is not ours is "unable to associate RDMA channel with specified I_T nexus"; an IU
//! length below 64 bytes or above what we accept is "requested maximum initiator to target IU
//! length value too large".

use super::iu::{buf_fmt, rej_reason, req_flags, rsp_flags, Cmd, LoginRej, LoginReq, LoginRsp};

/// Limits of the target side of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest initiator-to-target IU accepted (the size of each receive buffer).
    pub max_it_iu_len: u32,
    /// Request limit granted to a channel: SRP_CMD and SRP_TSK_MGMT in flight.
    pub req_lim: u32,
    /// Channels one initiator may hold on one target port.
    pub max_channels: usize,
    /// Grant immediate data when asked.
    pub immediate_data: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // ib_srp's default IU is 8260 bytes (8 KiB of immediate data after 68 bytes);
            // larger values come from its max_it_iu_size= option.
            max_it_iu_len: 65536 + super::iu::IMM_DATA_OFFSET as u32,
            req_lim: 128,
            max_channels: 16,
            immediate_data: true,
        }
    }
}

/// The smallest IU the standard allows an initiator to announce (a LOGIN_REQ is 64 bytes).
pub const MIN_IT_IU_LEN: u32 = 64;

/// What a login established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelParams {
    pub initiator_port_id: [u8; 16],
    pub target_port_id: [u8; 16],
    /// Size of the initiator-to-target IUs (each receive buffer).
    pub it_iu_len: u32,
    /// Largest target-to-initiator IU (the initiator's receive buffers).
    pub ti_iu_len: u32,
    /// Credits granted at login.
    pub req_lim: u32,
    /// Offset of immediate data in an SRP_CMD, when immediate data was granted.
    pub imm_data_offset: Option<u16>,
    /// The login asked to terminate this initiator's other channels.
    pub single: bool,
}

impl ChannelParams {
    /// The LOGIN_RSP announcing these parameters; `terminated` says whether other channels
    /// of the initiator were terminated (single-channel login) or maintained.
    pub fn login_rsp(&self, tag: u64, terminated: bool) -> LoginRsp {
        let mut flags = if self.single {
            if terminated {
                rsp_flags::TERMINATED
            } else {
                rsp_flags::NO_CHAN
            }
        } else {
            rsp_flags::MAINTAINED
        };
        if self.imm_data_offset.is_some() {
            flags |= rsp_flags::IMMED_SUPP;
        }
        LoginRsp {
            req_lim_delta: self.req_lim,
            tag,
            max_it_iu_len: self.it_iu_len,
            max_ti_iu_len: self.ti_iu_len,
            buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
            rsp_flags: flags,
        }
    }
}

fn rej(req: &LoginReq, reason: u32) -> LoginRej {
    LoginRej {
        reason,
        tag: req.tag,
        buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
    }
}

/// Validates `req` for the target port `port_id` (`id_ext` ‖ `ioc_guid`). The port identifier
/// is also accepted with its halves swapped, the form Linux ib_srp uses with io_class=0xff00.
/// `existing` is the number of channels the initiator already holds on this port.
pub fn validate(
    req: &LoginReq,
    port_id: &[u8; 16],
    limits: &Limits,
    existing: usize,
) -> Result<ChannelParams, LoginRej> {
    let mut swapped = [0u8; 16];
    swapped[..8].copy_from_slice(&port_id[8..]);
    swapped[8..].copy_from_slice(&port_id[..8]);
    if req.target_port_id != *port_id && req.target_port_id != swapped {
        return Err(rej(req, rej_reason::UNABLE_ASSOCIATE_CHANNEL));
    }
    if req.req_it_iu_len < MIN_IT_IU_LEN || req.req_it_iu_len > limits.max_it_iu_len {
        return Err(rej(req, rej_reason::IT_IU_LENGTH_TOO_LARGE));
    }
    if req.req_buf_fmt & (buf_fmt::DIRECT | buf_fmt::INDIRECT) == 0 {
        return Err(rej(req, rej_reason::UNSUPPORTED_DESCRIPTOR_FMT));
    }
    let single = match req.req_flags & req_flags::MULTICHAN_MASK {
        req_flags::MULTICHAN_SINGLE => true,
        req_flags::MULTICHAN_MULTI => false,
        _ => return Err(rej(req, rej_reason::MULTI_CHANNEL_UNSUPPORTED)),
    };
    if !single && existing >= limits.max_channels {
        return Err(rej(req, rej_reason::CHANNEL_LIMIT_REACHED));
    }
    // Immediate data lies after the fixed SRP_CMD and its 4-byte length, inside the IU.
    let imm = req.imm_data_offset;
    let imm_data_offset = (limits.immediate_data
        && req.req_flags & req_flags::IMMED_REQUESTED != 0
        && usize::from(imm) >= Cmd::LEN + 4
        && u32::from(imm) < req.req_it_iu_len)
        .then_some(imm);
    Ok(ChannelParams {
        initiator_port_id: req.initiator_port_id,
        target_port_id: req.target_port_id,
        it_iu_len: req.req_it_iu_len,
        ti_iu_len: req.req_it_iu_len,
        req_lim: limits.req_lim,
        imm_data_offset,
        single,
    })
}

#[cfg(test)]
mod tests {
    use super::super::iu::IMM_DATA_OFFSET;
    use super::*;

    const PORT: [u8; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

    fn req() -> LoginReq {
        LoginReq {
            tag: 0x55,
            req_it_iu_len: 8260,
            req_buf_fmt: buf_fmt::DIRECT | buf_fmt::INDIRECT,
            req_flags: req_flags::IMMED_REQUESTED,
            imm_data_offset: IMM_DATA_OFFSET as u16,
            initiator_port_id: [0xaa; 16],
            target_port_id: PORT,
        }
    }

    fn reason(r: LoginReq) -> u32 {
        validate(&r, &PORT, &Limits::default(), 0)
            .unwrap_err()
            .reason
    }

    #[test]
    fn accepts_linux_defaults() {
        let p = validate(&req(), &PORT, &Limits::default(), 0).unwrap();
        assert_eq!(p.it_iu_len, 8260);
        assert_eq!(p.imm_data_offset, Some(68));
        assert!(p.single);
        let rsp = p.login_rsp(0x55, true);
        assert_eq!(rsp.tag, 0x55);
        assert_eq!(rsp.req_lim_delta, 128);
        assert_eq!(rsp.rsp_flags, rsp_flags::TERMINATED | rsp_flags::IMMED_SUPP);
        assert_eq!(p.login_rsp(0, false).rsp_flags, rsp_flags::IMMED_SUPP);
    }

    #[test]
    fn swapped_port_id_halves() {
        let mut r = req();
        r.target_port_id[..8].copy_from_slice(&PORT[8..]);
        r.target_port_id[8..].copy_from_slice(&PORT[..8]);
        assert!(validate(&r, &PORT, &Limits::default(), 0).is_ok());
    }

    #[test]
    fn bad_field() {
        let mut r = req();
        r.target_port_id[15] ^= 1;
        assert_eq!(reason(r), rej_reason::UNABLE_ASSOCIATE_CHANNEL);
        let mut r = req();
        r.req_it_iu_len = 63;
        assert_eq!(reason(r), rej_reason::IT_IU_LENGTH_TOO_LARGE);
        r.req_it_iu_len = Limits::default().max_it_iu_len + 1;
        assert_eq!(reason(r), rej_reason::IT_IU_LENGTH_TOO_LARGE);
        let mut r = req();
        r.req_buf_fmt = 0x8;
        assert_eq!(reason(r), rej_reason::UNSUPPORTED_DESCRIPTOR_FMT);
        let mut r = req();
        r.req_flags = 3;
        assert_eq!(reason(r), rej_reason::MULTI_CHANNEL_UNSUPPORTED);
        let mut r = req();
        r.req_flags = req_flags::MULTICHAN_MULTI;
        let l = Limits::default();
        let e = validate(&r, &PORT, &l, l.max_channels).unwrap_err();
        assert_eq!(e.reason, rej_reason::CHANNEL_LIMIT_REACHED);
        assert_eq!(e.tag, 0x55);
        let p = validate(&r, &PORT, &l, 1).unwrap();
        assert_eq!(p.imm_data_offset, None, "not requested");
        assert_eq!(p.login_rsp(0, false).rsp_flags, rsp_flags::MAINTAINED);
    }

    #[test]
    fn immediate_data_offset_checked() {
        let mut r = req();
        r.imm_data_offset = 40;
        assert_eq!(
            validate(&r, &PORT, &Limits::default(), 0)
                .unwrap()
                .imm_data_offset,
            None
        );
        r.imm_data_offset = 9000;
        assert_eq!(
            validate(&r, &PORT, &Limits::default(), 0)
                .unwrap()
                .imm_data_offset,
            None
        );
        let l = Limits {
            immediate_data: false,
            ..Limits::default()
        };
        assert_eq!(
            validate(&req(), &PORT, &l, 0).unwrap().imm_data_offset,
            None
        );
    }
}
