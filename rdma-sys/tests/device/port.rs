//! Port, GID and device queries: the ported inlines against the exported symbols.

use std::mem::offset_of;
use std::os::raw::c_int;
use std::ptr::{self, null};

use rdma_verbs_sys::*;

use crate::common::LeakCheck;
use crate::common::{check_rc, Device, PORT};

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn query_port_takes_the_provider_path_and_agrees_with_the_compat_symbol() {
    let _leaks = LeakCheck::new();
    let dev = Device::open();

    // The context is an extended one with a `query_port` op, so the port below calls
    // the provider's op and not the compat fallback.
    // SAFETY: the context is open; the offset is that of a function-pointer field.
    let vctx = unsafe { verbs_get_ctx_op(dev.ctx, offset_of!(verbs_context, query_port)) };
    assert!(!vctx.is_null(), "{}: no query_port op in the verbs_context", dev.name);
    // SAFETY: the context is open.
    assert_eq!(unsafe { verbs_get_ctx(dev.ctx) }, vctx);

    let mut attr = ibv_port_attr::default();
    // SAFETY: the context is open and `attr` writable.
    check_rc(unsafe { ibv_query_port(dev.ctx, PORT, &mut attr) }, "ibv_query_port");
    assert_eq!(attr.state.0, ibv_port_state::IBV_PORT_ACTIVE.0, "port {PORT} is not active");
    assert!(
        attr.active_mtu.0 >= ibv_mtu::IBV_MTU_256.0 && attr.active_mtu.0 <= attr.max_mtu.0,
        "active MTU enum {} outside 256..=max ({})",
        attr.active_mtu.0,
        attr.max_mtu.0
    );
    assert!(attr.gid_tbl_len > c_int::from(dev.gid_index), "GID table of {}", attr.gid_tbl_len);
    assert!(attr.max_msg_sz > 0);

    // The exported symbol fills the old layout, a prefix of ibv_port_attr; start from
    // a different fill byte so that agreement cannot come from two zeroed structs.
    let mut compat = ibv_port_attr::default();
    // SAFETY: ibv_port_attr is plain data (integers and integer newtypes), so any byte
    // pattern is a valid value.
    unsafe { ptr::write_bytes(&mut compat, 0xa5, 1) };
    // SAFETY: the context is open; the compat layout is no larger than ibv_port_attr.
    let rc = unsafe { ibv_query_port_compat(dev.ctx, PORT, ptr::addr_of_mut!(compat).cast()) };
    check_rc(rc, "ibv_query_port (compat symbol)");
    assert_eq!(compat.state.0, attr.state.0);
    assert_eq!(compat.max_mtu.0, attr.max_mtu.0);
    assert_eq!(compat.active_mtu.0, attr.active_mtu.0);
    assert_eq!(compat.gid_tbl_len, attr.gid_tbl_len);
    assert_eq!(compat.port_cap_flags, attr.port_cap_flags);
    assert_eq!(compat.max_msg_sz, attr.max_msg_sz);
    assert_eq!(compat.pkey_tbl_len, attr.pkey_tbl_len);
    assert_eq!(compat.lid, attr.lid);
    assert_eq!(compat.sm_lid, attr.sm_lid);
    assert_eq!(compat.max_vl_num, attr.max_vl_num);
    assert_eq!(compat.active_width, attr.active_width);
    assert_eq!(compat.active_speed, attr.active_speed);
    assert_eq!(compat.phys_state, attr.phys_state);
    assert_eq!(compat.link_layer, attr.link_layer);
    eprintln!(
        "{}: port {PORT} active, MTU enum {} (max {}), {} GIDs, link layer {}",
        dev.name, attr.active_mtu.0, attr.max_mtu.0, attr.gid_tbl_len, attr.link_layer
    );
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn query_gid_ex_gid_table_and_device_ex_agree_with_the_plain_queries() {
    let _leaks = LeakCheck::new();
    let dev = Device::open();
    let index = u32::from(dev.gid_index);

    let mut entry = ibv_gid_entry::default();
    // SAFETY: the context is open and `entry` writable.
    let rc = unsafe { ibv_query_gid_ex(dev.ctx, u32::from(PORT), index, &mut entry, 0) };
    check_rc(rc, "ibv_query_gid_ex");
    // SAFETY: both are 16-byte GIDs; `raw` covers the whole union.
    let (got, want) = unsafe { (entry.gid.raw, dev.gid.raw) };
    assert_eq!(got, want, "ibv_query_gid_ex and ibv_query_gid disagree on GID {index}");
    assert_eq!((entry.gid_index, entry.port_num), (index, u32::from(PORT)));
    // The kernel names the GID type in sysfs; the entry must say the same.
    let sysfs = format!("/sys/class/infiniband/{}/ports/{PORT}/gid_attrs/types/{index}", dev.name);
    let sys_type = std::fs::read_to_string(&sysfs).unwrap_or_else(|e| panic!("read {sysfs}: {e}"));
    let want_type = match sys_type.trim() {
        "RoCE v2" => ibv_gid_type::IBV_GID_TYPE_ROCE_V2.0,
        "IB/RoCE v1" if dev.port_attr.link_layer == IBV_LINK_LAYER_ETHERNET.0 as u8 => {
            ibv_gid_type::IBV_GID_TYPE_ROCE_V1.0
        }
        "IB/RoCE v1" => ibv_gid_type::IBV_GID_TYPE_IB.0,
        other => panic!("unknown GID type {other:?} in {sysfs}"),
    };
    assert_eq!(entry.gid_type, want_type, "GID {index} type vs sysfs {:?}", sys_type.trim());

    let mut table = vec![ibv_gid_entry::default(); dev.port_attr.gid_tbl_len as usize];
    // SAFETY: the context is open and `table` has room for `table.len()` entries.
    let n = unsafe { ibv_query_gid_table(dev.ctx, table.as_mut_ptr(), table.len(), 0) };
    assert!(n > 0, "ibv_query_gid_table returned {n}");
    let same = table[..n as usize]
        .iter()
        .find(|e| e.port_num == u32::from(PORT) && e.gid_index == index)
        .unwrap_or_else(|| panic!("GID {index} missing from the {n} valid entries"));
    // SAFETY: as above, `raw` covers the union.
    assert_eq!(unsafe { same.gid.raw }, want);
    assert_eq!(same.gid_type, entry.gid_type);

    let mut ex = ibv_device_attr_ex::default();
    // SAFETY: the context is open, input may be null, `ex` is writable.
    check_rc(unsafe { ibv_query_device_ex(dev.ctx, null(), &mut ex) }, "ibv_query_device_ex");
    let mut plain = ibv_device_attr::default();
    // SAFETY: the context is open and `plain` writable.
    check_rc(unsafe { ibv_query_device(dev.ctx, &mut plain) }, "ibv_query_device");
    let o = &ex.orig_attr;
    assert_eq!(o.fw_ver, plain.fw_ver);
    assert_eq!(o.node_guid, plain.node_guid);
    assert_eq!(o.vendor_id, plain.vendor_id);
    assert_eq!(o.max_mr_size, plain.max_mr_size);
    assert_eq!((o.max_qp, o.max_cq, o.max_mr, o.max_pd), (plain.max_qp, plain.max_cq, plain.max_mr, plain.max_pd));
    assert_eq!((o.max_srq, o.max_mw, o.atomic_cap.0), (plain.max_srq, plain.max_mw, plain.atomic_cap.0));
    assert_eq!(o.phys_port_cnt, plain.phys_port_cnt);
    assert!(o.max_qp > 0 && o.phys_port_cnt >= PORT);
    let max_qp = o.max_qp;

    // A non-zero input comp_mask is refused before the provider is asked.
    let input = ibv_query_device_ex_input { comp_mask: 1 };
    // SAFETY: as above, with a readable `input`.
    assert_eq!(unsafe { ibv_query_device_ex(dev.ctx, &input, &mut ex) }, libc::EINVAL);
    eprintln!("{}: GID {index} type {} ({n} valid GIDs), max_qp {max_qp}", dev.name, sys_type.trim());
}
