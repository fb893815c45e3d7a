//! Devices, contexts, ports, GIDs and protection domains.

use rdma_verbs::{
    devices, Context, Error, GidType, LinkLayer, PhysState, PortState, ProtectionDomain, Transport, Verb,
};

use crate::{device_name, gid_index, open, LeakCheck};

const NEEDS: &str = "needs an RDMA device: run scripts/test";

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn device_list_has_the_device_under_test_and_opens_it_by_name() {
    let _leaks = LeakCheck::new();
    let list = devices().unwrap();
    assert!(!list.is_empty(), "{NEEDS}");
    let dev = list.find(&device_name()).unwrap();
    assert_eq!(dev.name(), device_name());
    assert_ne!(dev.guid(), 0);
    // rxe speaks InfiniBand's transport over UDP (RoCE v2); siw is iWARP, as the test bed
    // says (RDMA_TRANSPORT, from scripts/rxe: iwarp on siw).
    let transport = match std::env::var("RDMA_TRANSPORT").as_deref() {
        Ok("iwarp") => Transport::Iwarp,
        _ => Transport::Ib,
    };
    assert_eq!(dev.transport(), transport);
    let ctx = dev.open().unwrap();
    assert_eq!(ctx.transport(), transport);
    drop(list); // the context does not need the list
    assert_eq!(ctx.name(), device_name());
    let attr = ctx.query_device().unwrap();
    assert_eq!(attr.node_guid, dev_guid(&ctx));
    assert!(attr.phys_port_cnt >= 1);
    assert!(attr.max_qp > 0 && attr.max_qp_wr > 0 && attr.max_sge > 0 && attr.max_cqe > 0);
    assert!(attr.max_mr_size > 0);
    ctx.destroy().unwrap();
}

fn dev_guid(ctx: &Context) -> u64 {
    devices().unwrap().find(ctx.name()).unwrap().guid()
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn unknown_device_name_is_a_clear_error_listing_what_exists() {
    let _leaks = LeakCheck::new();
    let err = Context::open(Some("no-such-device")).unwrap_err();
    assert!(matches!(err, Error::UnknownDevice { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no-such-device") && text.contains(&device_name()), "{text}");
    // Nothing else was disturbed.
    open().query_device().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn port_one_is_active_with_link_up_and_a_rate() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let port = ctx.query_port(1).unwrap();
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.phys_state, PhysState::LinkUp);
    assert!(port.active_mtu.bytes() >= 256, "{port:?}");
    assert!(port.rate_gbps() > 0.0, "{port:?}");
    assert!(port.gid_tbl_len > 0);
    if ctx.name().starts_with("rxe") {
        assert_eq!(port.link_layer, LinkLayer::Ethernet);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn gid_table_has_the_ipv4_roce_v2_gid_and_it_is_the_default_choice() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let table = ctx.gid_table(1).unwrap();
    assert!(!table.is_empty());
    let chosen = ctx.default_gid(1).unwrap();
    assert_eq!(chosen.index, gid_index(), "table: {table:?}");
    if ctx.query_port(1).unwrap().link_layer == LinkLayer::Ethernet {
        assert_eq!(chosen.gid_type, GidType::RoceV2);
        let ip = chosen.gid.ipv4().expect("IPv4-mapped");
        if let Ok(want) = std::env::var("RDMA_IP") {
            assert_eq!(ip.to_string(), want);
        }
        assert!(chosen.netdev.is_some(), "RoCE GIDs name their netdev: {chosen:?}");
    }
    let one = ctx.query_gid(1, chosen.index).unwrap();
    assert_eq!(one, chosen);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn bad_port_and_gid_index_are_errors_that_leave_the_context_usable() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let len = ctx.query_port(1).unwrap().gid_tbl_len;
    for port in [0u8, 77] {
        let err = ctx.query_port(port).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { verb: Verb::QueryPort, .. }), "{err:?}");
    }
    let err = ctx.query_gid(1, len).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(err.to_string().contains("past the table"), "{err}");
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
    ProtectionDomain::new(&ctx).unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn pd_outlives_a_dropped_context_handle_and_frees_both_at_the_end() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let pd2 = pd.clone();
    drop(ctx); // the parent handle first
    assert_eq!(pd.context().name(), device_name());
    drop(pd);
    // Still usable through the clone.
    let _again = ProtectionDomain::new(pd2.context()).unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn destroy_reports_ebusy_while_children_live_and_succeeds_after() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let err = ctx.clone().destroy().unwrap_err();
    assert_eq!(err.errno(), Some(libc::EBUSY), "{err}");
    pd.destroy().unwrap();
    ctx.destroy().unwrap();
}
