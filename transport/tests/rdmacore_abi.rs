//! rtgt's rdma-core types against the real headers: a C program built with the host's
//! `verbs.h` and `rdma_cma.h` prints the size and alignment of every struct
//! `rtgt_transport::rdmacore::sys` declares and the offset of every field rtgt reads or writes,
//! and each must match Rust's. Needs a C compiler and rdma-core's headers (Debian:
//! libibverbs-dev, librdmacm-dev); the libraries themselves are then loaded for real. Without
//! them the tests skip with one line, except in CI.

use std::collections::HashMap;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use rtgt_transport::rdmacore::sys::*;
use rtgt_transport::rdmacore::{RdmaCore, RdmaCoreError};

#[path = "../src/test_support.rs"]
mod test_support;
use test_support::skip_or_fail;

/// Sizes and alignments (`size:T`, `align:T`) and offsets (`T.field`) as Rust lays them out.
fn rust_layout() -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = Vec::new();
    macro_rules! ty {
        ($($t:ident),*) => {$(
            v.push((format!("size:{}", stringify!($t)), size_of::<$t>()));
            v.push((format!("align:{}", stringify!($t)), align_of::<$t>()));
        )*};
    }
    macro_rules! off {
        ($t:ident: $($f:ident),*) => {$(
            v.push((format!("{}.{}", stringify!($t), stringify!($f)), offset_of!($t, $f)));
        )*};
    }
    ty!(
        ibv_context_ops,
        ibv_context,
        ibv_device_attr,
        ibv_port_attr,
        ibv_gid,
        ibv_gid_entry,
        ibv_pd,
        ibv_mr,
        ibv_comp_channel,
        ibv_cq,
        ibv_srq,
        ibv_srq_attr,
        ibv_srq_init_attr,
        ibv_qp,
        ibv_qp_cap,
        ibv_qp_init_attr,
        ibv_global_route,
        ibv_ah_attr,
        ibv_qp_attr,
        ibv_sge,
        ibv_send_wr,
        ibv_recv_wr,
        ibv_wc,
        ibv_async_event,
        rdma_event_channel,
        rdma_ib_addr,
        rdma_addr,
        rdma_route,
        rdma_cm_id,
        rdma_conn_param,
        rdma_ud_param,
        rdma_cm_event
    );
    off!(ibv_context_ops: poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv);
    off!(ibv_context: device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat);
    off!(ibv_device_attr: fw_ver, node_guid, max_mr_size, max_qp, max_qp_wr, device_cap_flags,
        max_sge, max_cqe, max_mr, max_qp_rd_atom, max_qp_init_rd_atom, atomic_cap, max_srq,
        max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt);
    off!(ibv_port_attr: state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
        pkey_tbl_len, lid, lmc, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2);
    off!(ibv_gid_entry: gid, gid_index, port_num, gid_type, ndev_ifindex);
    off!(ibv_pd: context, handle);
    off!(ibv_mr: context, pd, addr, length, handle, lkey, rkey);
    off!(ibv_comp_channel: context, fd, refcnt);
    off!(ibv_cq: context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed);
    off!(ibv_srq: context, srq_context, pd, handle, mutex, cond, events_completed);
    off!(ibv_srq_init_attr: srq_context, attr);
    off!(ibv_qp: context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
        mutex, cond, events_completed);
    off!(ibv_qp_init_attr: qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all);
    off!(ibv_global_route: dgid, flow_label, sgid_index, hop_limit, traffic_class);
    off!(ibv_ah_attr: grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
    off!(ibv_qp_attr: qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
        dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit);
    off!(ibv_sge: addr, length, lkey);
    off!(ibv_send_wr: wr_id, next, sg_list, num_sge, opcode, send_flags,
        imm_data_or_invalidate_rkey, wr, remote_srqn, _bind_mw_or_tso);
    off!(ibv_rdma_wr: remote_addr, rkey);
    off!(ibv_ud_wr: ah, remote_qpn, remote_qkey);
    off!(ibv_recv_wr: wr_id, next, sg_list, num_sge);
    off!(ibv_wc: wr_id, status, opcode, vendor_err, byte_len, imm_data_or_invalidated_rkey,
        qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits);
    off!(ibv_async_event: element, event_type);
    off!(rdma_ib_addr: sgid, dgid, pkey);
    off!(rdma_addr: src, dst, ibaddr);
    off!(rdma_route: addr, path_rec, num_paths);
    off!(rdma_cm_id: verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
        send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type);
    off!(rdma_conn_param: private_data, private_data_len, responder_resources, initiator_depth,
        flow_control, retry_count, rnr_retry_count, srq, qp_num);
    off!(rdma_ud_param: private_data, private_data_len, ah_attr, qp_num, qkey);
    off!(rdma_cm_event: id, listen_id, event, status, param);
    v
}

/// The C name of a Rust-side name: fields rtgt renamed (anonymous unions, the `wr` members
/// declared inline in C) and the constants.
fn c_expr(key: &str) -> String {
    let rename = |f: &str| -> String {
        match f {
            "ibv_context_ops" | "ibv_context" | "ibv_device_attr" | "ibv_port_attr"
            | "ibv_gid_entry" | "ibv_pd" | "ibv_mr" | "ibv_comp_channel" | "ibv_cq" | "ibv_srq"
            | "ibv_srq_attr" | "ibv_srq_init_attr" | "ibv_qp" | "ibv_qp_cap"
            | "ibv_qp_init_attr" | "ibv_global_route" | "ibv_ah_attr" | "ibv_qp_attr"
            | "ibv_sge" | "ibv_send_wr" | "ibv_recv_wr" | "ibv_wc" | "ibv_async_event"
            | "rdma_event_channel" | "rdma_ib_addr" | "rdma_addr" | "rdma_route" | "rdma_cm_id"
            | "rdma_conn_param" | "rdma_ud_param" | "rdma_cm_event" => {
                format!("struct {f}")
            }
            "ibv_gid" => "union ibv_gid".into(),
            other => other.into(),
        }
    };
    if let Some(t) = key.strip_prefix("size:") {
        return format!("sizeof({})", rename(t));
    }
    if let Some(t) = key.strip_prefix("align:") {
        return format!("_Alignof({})", rename(t));
    }
    let (t, f) = key.split_once('.').expect("T.field");
    let (t, f) = match (t, f) {
        ("ibv_send_wr", "imm_data_or_invalidate_rkey") => ("struct ibv_send_wr", "imm_data"),
        ("ibv_send_wr", "remote_srqn") => ("struct ibv_send_wr", "qp_type.xrc.remote_srqn"),
        ("ibv_send_wr", "_bind_mw_or_tso") => ("struct ibv_send_wr", "bind_mw"),
        ("ibv_rdma_wr", f) => {
            return format!(
                "offsetof(struct ibv_send_wr, wr.rdma.{f}) - offsetof(struct ibv_send_wr, wr)"
            )
        }
        ("ibv_ud_wr", f) => {
            return format!(
                "offsetof(struct ibv_send_wr, wr.ud.{f}) - offsetof(struct ibv_send_wr, wr)"
            )
        }
        ("ibv_wc", "imm_data_or_invalidated_rkey") => ("struct ibv_wc", "imm_data"),
        ("ibv_async_event", "element") => ("struct ibv_async_event", "element.cq"),
        ("rdma_addr", "src") => ("struct rdma_addr", "src_storage"),
        ("rdma_addr", "dst") => ("struct rdma_addr", "dst_storage"),
        ("rdma_addr", "ibaddr") => ("struct rdma_addr", "addr.ibaddr"),
        ("ibv_context_ops", f) => ("struct ibv_context_ops", f),
        (t, f) => return format!("offsetof({}, {f})", rename(t)),
    };
    format!("offsetof({t}, {f})")
}

/// Each `(key, C expression)` evaluated by a C program built against rdma-core's headers;
/// `None` (the test skipped) where there is no compiler or no headers.
fn c_values(exprs: &[(String, String)]) -> Option<HashMap<String, u64>> {
    let dir = std::env::temp_dir().join(format!(
        "rtgt-rdmacore-abi-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (k, e) in exprs {
        src.push_str(&format!(
            "printf(\"{k} %llu\\n\", (unsigned long long)({e}));\n"
        ));
    }
    src.push_str("return 0; }\n");
    let c = dir.join("abi.c");
    let exe = dir.join("abi");
    std::fs::write(&c, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = match Command::new(&cc).arg(&c).arg("-o").arg(&exe).output() {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            skip_or_fail(format!("no C compiler ({cc}: {e})"));
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        if stderr.contains("No such file") && stderr.contains(".h") {
            skip_or_fail("rdma-core's headers are missing (Debian: libibverbs-dev librdmacm-dev)");
            return None;
        }
        panic!("compiling against rdma-core's headers failed:\n{stderr}");
    }
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let _ = std::fs::remove_dir_all(&dir);
    Some(
        String::from_utf8(run.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (k, n) = l.rsplit_once(' ').unwrap();
                (k.to_string(), n.parse().unwrap())
            })
            .collect(),
    )
}

#[test]
fn types_match_the_rdma_core_headers() {
    let rust = rust_layout();
    let exprs: Vec<(String, String)> = rust.iter().map(|(k, _)| (k.clone(), c_expr(k))).collect();
    let Some(c) = c_values(&exprs) else {
        return;
    };
    let wrong: Vec<String> = rust
        .iter()
        .filter(|(k, n)| c.get(k) != Some(&(*n as u64)))
        .map(|(k, n)| format!("{k}: rust {n}, C {:?}", c.get(k)))
        .collect();
    assert!(wrong.is_empty(), "layouts differ:\n{}", wrong.join("\n"));
    assert!(rust.len() > 250, "{} checks", rust.len());
}

#[test]
fn constants_match_the_rdma_core_headers() {
    let consts: &[(&str, u64)] = &[
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET.into()),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE.into()),
        ("IBV_QPT_RC", IBV_QPT_RC.into()),
        ("IBV_QPS_RTS", IBV_QPS_RTS.into()),
        ("IBV_QPS_ERR", IBV_QPS_ERR.into()),
        ("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ.into()),
        ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as u64),
        ("IBV_QP_AV", IBV_QP_AV as u64),
        ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as u64),
        ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as u64),
        ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as u64),
        ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as u64),
        ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as u64),
        (
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            IBV_QP_MAX_DEST_RD_ATOMIC as u64,
        ),
        ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as u64),
        ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ.into()),
        ("IBV_WR_LOCAL_INV", IBV_WR_LOCAL_INV.into()),
        ("IBV_WR_SEND_WITH_INV", IBV_WR_SEND_WITH_INV.into()),
        ("IBV_SEND_INLINE", IBV_SEND_INLINE.into()),
        ("IBV_WC_LOCAL_INV", IBV_WC_LOCAL_INV.into()),
        ("IBV_WC_RECV", IBV_WC_RECV.into()),
        ("IBV_WC_WITH_INV", IBV_WC_WITH_INV.into()),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            IBV_WR_RDMA_WRITE_WITH_IMM.into(),
        ),
        ("IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM.into()),
        (
            "IBV_WR_ATOMIC_CMP_AND_SWP",
            IBV_WR_ATOMIC_CMP_AND_SWP.into(),
        ),
        (
            "IBV_WR_ATOMIC_FETCH_AND_ADD",
            IBV_WR_ATOMIC_FETCH_AND_ADD.into(),
        ),
        ("IBV_SEND_FENCE", IBV_SEND_FENCE.into()),
        ("IBV_SEND_SOLICITED", IBV_SEND_SOLICITED.into()),
        ("IBV_WC_LOC_LEN_ERR", IBV_WC_LOC_LEN_ERR.into()),
        ("IBV_WC_LOC_QP_OP_ERR", IBV_WC_LOC_QP_OP_ERR.into()),
        ("IBV_WC_LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR.into()),
        ("IBV_WC_WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR.into()),
        ("IBV_WC_BAD_RESP_ERR", IBV_WC_BAD_RESP_ERR.into()),
        ("IBV_WC_LOC_ACCESS_ERR", IBV_WC_LOC_ACCESS_ERR.into()),
        ("IBV_WC_REM_INV_REQ_ERR", IBV_WC_REM_INV_REQ_ERR.into()),
        ("IBV_WC_REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR.into()),
        ("IBV_WC_REM_OP_ERR", IBV_WC_REM_OP_ERR.into()),
        ("IBV_WC_RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR.into()),
        ("IBV_WC_RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR.into()),
        ("IBV_WC_COMP_SWAP", IBV_WC_COMP_SWAP.into()),
        ("IBV_WC_FETCH_ADD", IBV_WC_FETCH_ADD.into()),
        (
            "IBV_WC_RECV_RDMA_WITH_IMM",
            IBV_WC_RECV_RDMA_WITH_IMM.into(),
        ),
        ("IBV_WC_GRH", IBV_WC_GRH.into()),
        ("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM.into()),
        ("IBV_GID_TYPE_ROCE_V2", IBV_GID_TYPE_ROCE_V2.into()),
        ("RDMA_PS_TCP", RDMA_PS_TCP.into()),
        (
            "RDMA_CM_EVENT_CONNECT_REQUEST",
            RDMA_CM_EVENT_CONNECT_REQUEST.into(),
        ),
        (
            "RDMA_CM_EVENT_ESTABLISHED",
            RDMA_CM_EVENT_ESTABLISHED.into(),
        ),
        (
            "RDMA_CM_EVENT_DISCONNECTED",
            RDMA_CM_EVENT_DISCONNECTED.into(),
        ),
        (
            "RDMA_CM_EVENT_DEVICE_REMOVAL",
            RDMA_CM_EVENT_DEVICE_REMOVAL.into(),
        ),
        (
            "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            RDMA_CM_EVENT_TIMEWAIT_EXIT.into(),
        ),
    ];
    let exprs: Vec<(String, String)> = consts
        .iter()
        .map(|(k, _)| (k.to_string(), k.to_string()))
        .collect();
    let Some(c) = c_values(&exprs) else {
        return;
    };
    for (k, v) in consts {
        assert_eq!(c.get(*k), Some(v), "{k}");
    }
}

/// The libraries load with every function at its version; the device list is readable where
/// the kernel has RDMA support (every device listed with a port), and where it has none (no
/// `ib_uverbs`: no /sys/class/infiniband_verbs) that is the error, in words that say what to load.
#[test]
fn libraries_load_and_list_devices() {
    let lib = match RdmaCore::load() {
        Ok(lib) => lib,
        Err(e @ RdmaCoreError::Library { .. }) => return skip_or_fail(e),
        Err(e) => panic!("{e}"),
    };
    let uverbs = std::path::Path::new("/sys/class/infiniband_verbs").exists();
    match lib.devices() {
        Ok(devs) => {
            assert!(uverbs, "devices without ib_uverbs: {devs:?}");
            for d in &devs {
                assert!(!d.ports.is_empty(), "{d:?}");
                assert!(d.max_qp > 0 && d.max_cqe > 0, "{d:?}");
            }
        }
        Err(e) => {
            assert!(!uverbs, "ib_uverbs is there, yet: {e}");
            assert_eq!(e, RdmaCoreError::NoKernelSupport);
            assert!(e.to_string().contains("ib_uverbs"), "{e}");
        }
    }
}
