//! The extended CQ: completions polled through ibv_start_poll / next / end, each once, in
//! order, with its bytes and fields; timestamps where the device has them (rxe does not).

use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, Chunk, CompletionQueue, Error, ExtendedCompletion, InitAttr, ProtectionDomain, QpType, QueuePair,
    SendWr, Verb, WcFields, WcOpcode, WcStatus,
};
use rdma_verbs::{AddressHandle, AhAttr, WcFlags, GRH_LEN};

use crate::datapath::{chunks, poll_one};
use crate::LeakCheck;
use crate::{gid_index, open};

/// Two connected RC QPs: A's CQ classic, B's built extended with `fields`.
fn pair(fields: WcFields) -> (ProtectionDomain, CompletionQueue, QueuePair, CompletionQueue, QueuePair) {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq_a = CompletionQueue::new(&ctx, 256).unwrap();
    let cq_b = CompletionQueue::builder(&ctx, 256).extended(fields).build().unwrap();
    assert!(cq_b.is_extended() && !cq_a.is_extended());
    let qp = |cq: &CompletionQueue| {
        QueuePair::builder(&pd, QpType::Rc, cq, cq).max_send_wr(64).max_recv_wr(64).build().unwrap()
    };
    let (a, b) = (qp(&cq_a), qp(&cq_b));
    a.connect(&InitAttr::default(), &b.local_info(1).unwrap()).unwrap();
    b.connect(&InitAttr::default(), &a.local_info(1).unwrap()).unwrap();
    (pd, cq_a, a, cq_b, b)
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_extended_cq_hands_out_each_completion_once_in_order_with_its_bytes_imm_and_qp_across_many_polls() {
    let _leaks = LeakCheck::new();
    let (pd, mut cq_a, a, mut cq_b, b) = pair(WcFields::empty());
    const N: usize = 40;
    let (mut sq, mut rq) = (a.send_queue::<Chunk>().unwrap(), b.recv_queue::<Chunk>().unwrap());
    for (i, c) in chunks(&pd, N, 256, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        rq.post(c, 0..256, i as u64).unwrap();
    }
    for (i, mut c) in chunks(&pd, N, 256, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        let len = 10 + i;
        c[..len].fill(i as u8 + 1);
        if let Err(r) = sq.post(SendWr::send(c, 0..len).imm(0x1000 + i as u32).id(i as u64)) {
            panic!("{}", r.error);
        }
        // Take the send completions as they come, so the send queue never fills.
        let mut wc = poll_one(&mut cq_a);
        sq.complete(&mut wc, |d| assert!(d.result().is_ok())).unwrap();
    }
    // Out of 3: batches end on a full array and on an empty queue, over and over (the
    // path where rdma-core 44's rxe loses its place when ibv_next_poll is used).
    let mut out: [ExtendedCompletion; 3] = std::array::from_fn(|_| ExtendedCompletion::EMPTY);
    let (mut next, deadline) = (0, Instant::now() + Duration::from_secs(20));
    while next < N {
        assert!(Instant::now() < deadline, "{next} of {N} receives within 20 s");
        for c in cq_b.poll_extended(&mut out).unwrap().iter_mut() {
            assert_eq!(c.status(), WcStatus::Success, "{c:?}");
            assert_eq!(c.opcode(), WcOpcode::Recv);
            assert_eq!(c.imm_data(), Some(0x1000 + next as u32), "completions in order, each once");
            assert_eq!(c.qp_num(), b.qp_num());
            assert_eq!(c.byte_len() as usize, 10 + next);
            assert_eq!(c.timestamp(), None, "no timestamp asked for");
            let done = rq.complete(c).unwrap().result().unwrap();
            assert_eq!(done.id, next as u64);
            assert!(done.value[..10 + next].iter().all(|&x| x == next as u8 + 1), "bytes of message {next}");
            assert_eq!(c.wr_id(), 0, "complete marks the completion taken");
            assert!(rq.complete(c).is_err(), "a taken completion is refused");
            next += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(cq_b.poll_extended(&mut out).unwrap().is_empty(), "no completion twice, none made up past the end");
    let mut classic = [rdma_verbs::WorkCompletion::EMPTY; 4];
    assert!(cq_b.poll(&mut classic).unwrap().is_empty(), "the classic poll sees the same (empty) queue");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_failed_completion_on_an_extended_cq_keeps_its_status_qp_and_id() {
    let _leaks = LeakCheck::new();
    let (pd, _cq_a, a, mut cq_b, b) = pair(WcFields::empty());
    // B receives into a buffer too small for A's SEND: B's receive fails (local length).
    let mut rq = b.recv_queue::<Chunk>().unwrap();
    rq.post(chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).remove(0), 0..8, 5).unwrap();
    let mut sq = a.send_queue::<Chunk>().unwrap();
    if let Err(r) = sq.post(SendWr::send(chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).remove(0), 0..64)) {
        panic!("{}", r.error);
    }
    let mut out: [ExtendedCompletion; 2] = std::array::from_fn(|_| ExtendedCompletion::EMPTY);
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        assert!(Instant::now() < deadline, "no completion within 10 s");
        if let Some(c) = cq_b.poll_extended(&mut out).unwrap().first_mut() {
            break c;
        }
    };
    // A length error (rxe reports it as a local QP operation error).
    assert!(matches!(c.status(), WcStatus::LocLenErr | WcStatus::LocQpOpErr), "{c:?}");
    assert_eq!(c.qp_num(), b.qp_num());
    let done = rq.complete(c).unwrap();
    assert_eq!(done.id, 5, "the failed receive comes back with its id");
    let e = done.result().unwrap_err();
    assert!(e.to_string().contains("id 5"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn timestamps_on_a_device_without_them_are_a_typed_not_supported_bad_sizes_are_refused_and_a_classic_cq_refuses_poll_extended(
) {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let is_rxe = ctx.name().starts_with("rxe");
    match CompletionQueue::builder(&ctx, 16).extended(WcFields::COMPLETION_TIMESTAMP).build() {
        Err(e @ Error::NotSupported { verb: Verb::CreateCqEx, .. }) => {
            assert!(e.to_string().contains("timestamps"), "{e}");
            eprintln!("{}: {e}", ctx.name());
        }
        Err(e) => panic!("not a typed NotSupported: {e:?}"),
        Ok(cq) => {
            assert!(!is_rxe, "rxe has no completion timestamps, yet the CQ was built");
            assert!(cq.is_extended());
        }
    }
    // Sizes are checked before C as for a classic CQ.
    for cqe in [0, ctx.query_device().unwrap().max_cqe + 1] {
        let e = CompletionQueue::builder(&ctx, cqe).extended(WcFields::empty()).build().unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CqBuilderBuild, .. }), "cqe {cqe}: {e:?}");
    }
    let mut classic = CompletionQueue::new(&ctx, 16).unwrap();
    let mut out = [ExtendedCompletion::EMPTY];
    let e = classic.poll_extended(&mut out).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { verb: Verb::PollExtended, .. }), "{e:?}");
    assert!(e.to_string().contains("CqBuilder::extended"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_ud_datagram_polled_from_an_extended_cq_names_its_source_qp_and_carries_the_grh_and_bytes() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    const QKEY: u32 = 0x1111_2222;
    let ud = |cq: &CompletionQueue| {
        let qp = QueuePair::builder(&pd, QpType::Ud, cq, cq).max_send_wr(8).max_recv_wr(8).build().unwrap();
        qp.ready_ud(&InitAttr { qkey: QKEY, ..InitAttr::default() }).unwrap();
        qp
    };
    let mut cq_a = CompletionQueue::new(&ctx, 32).unwrap();
    let mut cq_b = CompletionQueue::builder(&ctx, 32).extended(WcFields::empty()).build().unwrap();
    let (a, b) = (ud(&cq_a), ud(&cq_b));
    let mut rq = b.recv_queue::<Chunk>().unwrap();
    rq.post(chunks(&pd, 1, GRH_LEN + 512, AccessFlags::LOCAL_WRITE).remove(0), 0..GRH_LEN + 512, 3).unwrap();
    let ah = AddressHandle::new(&pd, &AhAttr::global(1, b.local_info(1).unwrap().gid, gid_index())).unwrap();
    let mut sq = a.send_queue::<Chunk>().unwrap();
    let mut src = chunks(&pd, 1, 512, AccessFlags::LOCAL_WRITE).remove(0);
    let data: Vec<u8> = (0..300).map(|i| (i * 7 + 1) as u8).collect();
    src[..data.len()].copy_from_slice(&data);
    if let Err(r) = sq.post(SendWr::send_ud(src, 0..data.len(), &ah, b.qp_num(), QKEY).imm(77)) {
        panic!("{}", r.error);
    }
    let mut wc = poll_one(&mut cq_a);
    sq.complete(&mut wc, |d| assert_eq!(d.status, WcStatus::Success)).unwrap();

    let mut out = [ExtendedCompletion::EMPTY];
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        assert!(Instant::now() < deadline, "no datagram within 10 s");
        if let Some(c) = cq_b.poll_extended(&mut out).unwrap().first_mut() {
            break c;
        }
    };
    assert_eq!(c.status(), WcStatus::Success, "{c:?}");
    assert_eq!(c.src_qp(), a.qp_num(), "the source QP, read through ibv_wc_read_src_qp");
    assert!(c.wc_flags().contains(WcFlags::GRH), "{c:?}");
    assert_eq!(c.imm_data(), Some(77));
    let done = rq.complete(c).unwrap().result().unwrap();
    assert_eq!(done.byte_len as usize, GRH_LEN + data.len());
    assert_eq!(&done.value[GRH_LEN..GRH_LEN + data.len()], &data[..], "the datagram's bytes");
}
