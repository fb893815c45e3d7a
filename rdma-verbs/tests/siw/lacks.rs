//! What siw lacks, each refused by type and naming the capability the device reports
//! absent: memory windows (`max_mw` 0), address handles (`max_ah` 0), multicast
//! (`max_mcast_grp` 0), UC and UD QPs (iWARP is RC only), atomics (`IBV_ATOMIC_NONE`), and
//! the extended send API (the provider answers `EOPNOTSUPP`), and immediate data (iWARP
//! carries none) and atomics on the queues users post to. Each test first reads the
//! capability from the device, so it proves the refusal matches what the device says.

use rdma_test_support::{open, LeakCheck};
use rdma_verbs::{
    ffi, AddressHandle, AhAttr, AtomicCap, CompletionQueue, Done, Error, Gid, MwType, ProtectionDomain, QpType,
    QueuePair, SendBuf, SendOps, SendQueue, Verb, WcFields, WorkCompletion,
};

use crate::iwarp_device;

/// `e` is [`Error::NotSupported`] from our check before C, by `verb`, naming each of `words`.
#[track_caller]
fn refused_before_c(e: Error, verb: Verb, words: &[&str]) {
    let text = e.to_string();
    match &e {
        Error::NotSupported { verb: v, errno: None, .. } => assert_eq!(*v, verb, "{text}"),
        other => panic!("expected NotSupported before C from {verb:?}, got {other:?}"),
    }
    for word in words.iter().chain(&["refused before the call"]) {
        assert!(text.contains(word), "{word:?} missing from: {text}");
    }
    println!("{verb:?}: {text}");
}

/// The one request `sq` has outstanding, handed back by its completion (within 10 s).
#[track_caller]
fn the_one_back<T: SendBuf>(cq: &mut CompletionQueue, sq: &mut SendQueue<T>) -> Done<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut wc = [WorkCompletion::EMPTY; 1];
    loop {
        assert!(std::time::Instant::now() < deadline, "no completion within 10 s");
        if let Some(w) = cq.poll(&mut wc).unwrap().first_mut() {
            let mut done = None;
            sq.complete(w, |d| done = Some(d)).unwrap();
            return done.expect("the request came back");
        }
    }
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn memory_windows_are_not_supported_before_c_naming_max_mw_and_c_agrees() {
    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    assert_eq!(ctx.query_device().unwrap().raw.max_mw, 0, "siw reports no memory windows");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    for ty in [MwType::Type1, MwType::Type2] {
        refused_before_c(pd.alloc_mw(ty).unwrap_err(), Verb::PdAllocMw, &["memory windows", "max_mw is 0"]);
    }
    // The provider has no window either: the check refuses nothing C would have given.
    // SAFETY: the PD is live; a window it returned would be deallocated at once.
    let mw = unsafe { ffi::ibv_alloc_mw(pd.as_raw(), ffi::ibv_mw_type::IBV_MW_TYPE_1) };
    if !mw.is_null() {
        // SAFETY: the window was just allocated and nothing else holds it.
        unsafe { ffi::ibv_dealloc_mw(mw) };
        panic!("ibv_alloc_mw gave a window on a device reporting max_mw 0");
    }
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn address_handles_are_not_supported_before_c_naming_max_ah_and_c_agrees() {
    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    assert_eq!(ctx.query_device().unwrap().raw.max_ah, 0, "siw reports no address handles (no UD)");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let gid = ctx.query_gid(1, 0).unwrap().gid;
    let attr = AhAttr::global(1, gid, 0);
    refused_before_c(AddressHandle::new(&pd, &attr).unwrap_err(), Verb::AhNew, &["address handles", "max_ah is 0"]);
    let mut raw = attr.to_ffi().unwrap();
    // SAFETY: the PD is live and `raw` a valid address vector; a handle it returned would
    // be destroyed at once.
    let ah = unsafe { ffi::ibv_create_ah(pd.as_raw(), &mut raw) };
    if !ah.is_null() {
        // SAFETY: the handle was just created and nothing else holds it.
        unsafe { ffi::ibv_destroy_ah(ah) };
        panic!("ibv_create_ah gave a handle on a device reporting max_ah 0");
    }
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn uc_and_ud_qps_are_not_supported_before_c_naming_iwarp_and_c_agrees() {
    let name = iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    for ty in [QpType::Uc, QpType::Ud] {
        let e = QueuePair::builder(&pd, ty, &cq, &cq).max_send_wr(4).max_recv_wr(4).build().unwrap_err();
        refused_before_c(e, Verb::QueuePairBuilderBuild, &[&format!("{ty} QPs"), &name, "iWARP", "RC only"]);
    }
    // The provider agrees: it makes no UD QP.
    let mut attr = ffi::ibv_qp_init_attr {
        send_cq: cq.as_raw(),
        recv_cq: cq.as_raw(),
        cap: ffi::ibv_qp_cap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
        qp_type: ffi::ibv_qp_type::IBV_QPT_UD,
        ..Default::default()
    };
    // SAFETY: the PD and the CQ are live; a QP it returned would be destroyed at once.
    let qp = unsafe { ffi::ibv_create_qp(pd.as_raw(), &mut attr) };
    if !qp.is_null() {
        // SAFETY: the QP was just created and nothing else holds it.
        unsafe { ffi::ibv_destroy_qp(qp) };
        panic!("ibv_create_qp gave a UD QP on an iWARP device");
    }
    // An RC QP is made as ever.
    QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build().unwrap();
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn multicast_is_not_supported_before_c_naming_max_mcast_grp() {
    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    assert_eq!(ctx.query_device().unwrap().raw.max_mcast_grp, 0, "siw reports no multicast");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    // iWARP makes RC QPs only, and the device's answer comes before the QP type's.
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build().unwrap();
    let group = Gid([0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    refused_before_c(
        qp.attach_multicast(group, 0).unwrap_err(),
        Verb::QpAttachMulticast,
        &["multicast", "max_mcast_grp is 0"],
    );
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn atomic_send_ops_are_not_supported_before_c_naming_atomic_cap_none() {
    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    assert_eq!(ctx.query_device().unwrap().atomic_cap, AtomicCap::None, "siw has no atomics");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    for ops in [SendOps::ATOMIC_CMP_AND_SWP, SendOps::ATOMIC_FETCH_AND_ADD] {
        let e = QueuePair::builder(&pd, QpType::Rc, &cq, &cq)
            .max_send_wr(4)
            .max_recv_wr(4)
            .extended_send_ops(SendOps::SEND | ops)
            .build()
            .unwrap_err();
        refused_before_c(e, Verb::QueuePairBuilderBuild, &["atomics", "atomic_cap is IBV_ATOMIC_NONE"]);
    }
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn the_extended_send_api_is_not_supported_as_the_provider_answers() {
    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let e = QueuePair::builder(&pd, QpType::Rc, &cq, &cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .extended_send_ops(SendOps::SEND | SendOps::RDMA_WRITE)
        .build()
        .unwrap_err();
    let text = e.to_string();
    match &e {
        Error::NotSupported { verb: Verb::CreateQpEx, errno: Some(libc::EOPNOTSUPP), .. } => {}
        other => panic!("expected NotSupported from ibv_create_qp_ex with EOPNOTSUPP, got {other:?}"),
    }
    assert!(text.contains("the extended send API (ibv_wr_*"), "{text}");
    println!("{text}");
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn extended_cqs_and_cq_resizing_are_not_supported_as_the_provider_answers() {
    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    // siw's provider has no create_cq_ex: libibverbs answers EOPNOTSUPP.
    let e = CompletionQueue::builder(&ctx, 16).extended(WcFields::empty()).build().unwrap_err();
    match &e {
        Error::NotSupported { verb: Verb::CreateCqEx, errno: Some(libc::EOPNOTSUPP), capability } => {
            assert!(capability.contains("the extended CQ (ibv_create_cq_ex)"), "{e}")
        }
        other => panic!("expected NotSupported from ibv_create_cq_ex with EOPNOTSUPP, got {other:?}"),
    }
    println!("{e}");
    // And no resize_cq: the CQ keeps its size and works on.
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let before = cq.cqe();
    let e = cq.resize(64).unwrap_err();
    match &e {
        Error::NotSupported { verb: Verb::ResizeCq, errno: Some(libc::EOPNOTSUPP | libc::ENOSYS), capability } => {
            assert!(capability.contains("CQ resizing: the provider has no resize_cq"), "{e}")
        }
        other => panic!("expected NotSupported from ibv_resize_cq, got {other:?}"),
    }
    println!("{e}");
    assert_eq!(cq.cqe(), before);
    assert!(cq.poll(&mut [rdma_verbs::WorkCompletion::EMPTY; 4]).unwrap().is_empty());
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn an_rdma_read_into_more_sges_than_max_sge_rd_is_refused_before_c_and_one_within_lands() {
    use rdma_test_support::connect_rc;
    use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, InitAttr, QpAccess, SendWr, WcStatus};

    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    let dev = ctx.query_device().unwrap();
    assert!(dev.raw.max_sge_rd == 1 && dev.max_sge > 1, "siw: max_sge_rd 1, max_sge {}", dev.max_sge);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).max_send_sge(2).build();
    let (a, b) = (qp().unwrap(), qp().unwrap());
    let link = connect_rc(&a, &b, &InitAttr { access: QpAccess::REMOTE_READ, ..InitAttr::default() });
    assert!(link.through_rdma_cm());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let mut target = pd.register_remote_writable(AlignedBuf::new(8192).unwrap(), access).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 + 5) as u8).collect();
    target.write_at(0, &data).unwrap();
    let mut chunks =
        pd.register(AlignedBuf::new(2 * 4096).unwrap(), AccessFlags::LOCAL_WRITE).unwrap().into_chunks(4096).unwrap();
    let two = [chunks.remove(0), chunks.remove(0)];
    let mut sq: SendQueue<[Chunk; 2]> = a.send_queue().unwrap();

    // 6000 bytes span both chunks: two SGEs, one more than siw scatters a READ into (it
    // would fill the first and leave the second untouched, without an error).
    let remote = target.remote().unwrap();
    let refused = sq.post(SendWr::read(two, 0..4096 + 1904, remote.slice(..6000).unwrap())).unwrap_err();
    let text = refused.error.to_string();
    assert!(
        matches!(refused.error, Error::InvalidArgument { verb: Verb::SendQueuePost, .. })
            && text.contains("into 2 SGEs")
            && text.contains("scatters a READ into 1 (max_sge_rd)"),
        "{text}"
    );
    assert!(text.contains("refused before ibv_post_send, nothing posted"), "{text}");
    assert_eq!(sq.outstanding(), 0, "nothing was posted");

    // Within the first chunk: one SGE, and every byte lands.
    let two = refused.value.into_buf();
    sq.post(SendWr::read(two, 100..4096, remote.slice(..3996).unwrap()).id(3)).unwrap();
    let back = the_one_back(&mut cq, &mut sq);
    assert_eq!((back.id, back.status), (3, WcStatus::Success));
    assert!(back.value[0][100..] == data[..3996], "the READ's bytes differ from the target's");
    drop((sq, link, a, b));
}

#[test]
#[ignore = "needs an iWARP device: scripts/test runs it on siw"]
fn immediate_data_and_atomics_built_posted_or_prepared_are_not_supported_before_c_and_a_write_after_lands() {
    use rdma_test_support::connect_rc;
    use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, InitAttr, PreparedSendQueue, QpAccess, SendWr, WcStatus};

    iwarp_device();
    let _leaks = LeakCheck::new();
    let ctx = open();
    assert_eq!(ctx.query_device().unwrap().atomic_cap, AtomicCap::None, "siw has no atomics");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let mut cq = CompletionQueue::new(&ctx, 16).unwrap();
    let imm = ["immediate data", "the device is iWARP", "RFC 5040"];
    let atomics = ["atomics (compare and swap, fetch and add)", "atomic_cap is IBV_ATOMIC_NONE"];
    // A QP built for the extended API with immediate data is refused at build.
    for ops in [SendOps::SEND_WITH_IMM, SendOps::RDMA_WRITE_WITH_IMM] {
        let e = QueuePair::builder(&pd, QpType::Rc, &cq, &cq)
            .max_send_wr(4)
            .max_recv_wr(4)
            .extended_send_ops(SendOps::SEND | ops)
            .build()
            .unwrap_err();
        refused_before_c(e, Verb::QueuePairBuilderBuild, &imm);
    }
    let qp = || QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(4).max_recv_wr(4).build();
    let (a, b) = (qp().unwrap(), qp().unwrap());
    let link = connect_rc(&a, &b, &InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() });
    assert!(link.through_rdma_cm());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let target = pd.register_remote_writable(AlignedBuf::new(4096).unwrap(), access).unwrap();
    let remote = target.remote().unwrap();
    let mut chunk: Chunk = pd
        .register(AlignedBuf::new(4096).unwrap(), AccessFlags::LOCAL_WRITE)
        .unwrap()
        .into_chunks(4096)
        .unwrap()
        .remove(0);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    chunk.copy_from_slice(&data);

    type Kind = fn(Chunk, rdma_verbs::RemoteMr) -> SendWr<Chunk>;
    let kinds: [(&str, Kind, &[&str]); 4] = [
        ("WRITE with immediate", |c, r| SendWr::write(c, 0..64, r.slice(..64).unwrap()).imm(7), &imm),
        ("SEND with immediate", |c, _| SendWr::send(c, 0..64).imm(7), &imm),
        ("compare and swap", |c, r| SendWr::compare_swap(c, 0, r.slice(..8).unwrap(), 0, 1), &atomics),
        ("fetch and add", |c, r| SendWr::fetch_add(c, 0, r.slice(..8).unwrap(), 1), &atomics),
    ];

    let mut sq: SendQueue<Chunk> = a.send_queue().unwrap();
    for (what, kind, words) in kinds {
        let refused = sq.post(kind(chunk, remote).id(1)).unwrap_err();
        println!("{what}:");
        refused_before_c(refused.error, Verb::SendQueuePost, words);
        assert_eq!(sq.outstanding(), 0, "{what}: nothing was posted");
        chunk = refused.value.into_buf();
    }
    // The queue works on: a WRITE lands every byte.
    sq.post(SendWr::write(chunk, 0..4096, remote).id(9)).unwrap();
    let back = the_one_back(&mut cq, &mut sq);
    assert_eq!((back.id, back.status), (9, WcStatus::Success));
    let mut got = vec![0u8; 4096];
    target.read_at(0, &mut got).unwrap();
    assert!(got == data, "the WRITE's bytes differ from the source's");
    chunk = back.value;
    drop(sq);

    // A prepared request is refused when it is prepared, the same way.
    let psq: PreparedSendQueue<Chunk> = a.prepared_send_queue().unwrap();
    for (what, kind, words) in kinds {
        let refused = psq.prepare(kind(chunk, remote)).unwrap_err();
        println!("prepared {what}:");
        refused_before_c(refused.error, Verb::SendQueuePrepare, words);
        chunk = refused.value.into_buf();
    }
    drop((psq, link, a, b));
}
