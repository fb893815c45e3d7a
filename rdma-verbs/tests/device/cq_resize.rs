//! CQ resizing with the CQ budget kept true, and CQ moderation (which rxe does not have).

use std::time::Duration;

use rdma_verbs::ffi;
use rdma_verbs::{AccessFlags, CompletionQueue, Error, QpAccess, QpType, QueuePair, SendWr, Verb, WcStatus};

use crate::datapath::{chunks, poll_one, random_bytes, rc_pair};
use crate::LeakCheck;

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn resizing_a_cq_up_keeps_its_pending_completions_and_each_is_polled_with_its_bytes() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<rdma_verbs::Chunk>(QpAccess::empty());
    const N: usize = 8;
    const LEN: usize = 1000;
    for (i, c) in chunks(&pd, N, LEN, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        if let Err(r) = b.rq.post(c, 0..LEN, i as u64) {
            panic!("{}", r.error);
        }
    }
    let payloads: Vec<Vec<u8>> = (0..N).map(|i| random_bytes(100 + i as u64, 10 + i * 100)).collect();
    for (i, (mut c, data)) in chunks(&pd, N, LEN, AccessFlags::LOCAL_WRITE).into_iter().zip(&payloads).enumerate() {
        c[..data.len()].copy_from_slice(data);
        if let Err(r) = a.sq.post(SendWr::send(c, 0..data.len()).id(i as u64)) {
            panic!("{}", r.error);
        }
    }
    // Every send acknowledged: the receives completed on B's CQ, which nobody polled yet.
    let mut acked = 0;
    while acked < N {
        let mut wc = poll_one(&mut a.cq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        acked += a.sq.complete(&mut wc, |_| ()).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));

    let before = b.cq.cqe();
    let granted = b.cq.resize(before + 1000).unwrap();
    assert!(granted >= before + 1000, "asked for {} entries, granted {granted}", before + 1000);
    assert_eq!(b.cq.cqe(), granted, "cqe() reports what the provider granted");
    eprintln!(
        "resized a CQ of {before} entries with {N} completions pending: asked {}, granted {granted}",
        before + 1000
    );

    for (i, data) in payloads.iter().enumerate() {
        let mut wc = poll_one(&mut b.cq);
        assert_eq!(wc.status(), WcStatus::Success, "{wc:?}");
        let got = b.rq.complete(&mut wc).unwrap();
        assert_eq!(got.id, i as u64, "the pending completions come out in order after the resize");
        assert_eq!(got.byte_len as usize, data.len());
        assert_eq!(&got.value[..data.len()], &data[..], "bytes of message {i}");
    }
    let mut rest = [rdma_verbs::WorkCompletion::EMPTY; 4];
    assert!(b.cq.poll(&mut rest).unwrap().is_empty(), "each completion once");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_cq_is_never_shrunk_below_what_its_claimed_queues_reserved_and_the_refusal_names_them() {
    let _leaks = LeakCheck::new();
    // Each side's CQ carries a send queue and a receive queue of 64: 128 entries reserved.
    let (pd, a, mut b) = rc_pair::<rdma_verbs::Chunk>(QpAccess::empty());
    let ctx = pd.context().clone();
    let max_cqe = ctx.query_device().unwrap().max_cqe;
    let before = b.cq.cqe();

    let e = b.cq.resize(127).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { verb: Verb::CqResize, .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("CompletionQueue::resize: invalid argument: cqe 127 is below the 128 entries reserved"),
        "{text}"
    );
    assert_eq!(b.cq.cqe(), before, "a refused resize changes nothing");
    for (cqe, want) in [(0, "cqe 0"), (max_cqe + 1, "exceeds the device's max_cqe")] {
        let e = b.cq.resize(cqe).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::CqResize, .. }), "{e:?}");
        assert!(e.to_string().contains(want), "{e}");
    }

    // Down to exactly what is reserved: allowed; the budget then counts the granted size.
    let granted = b.cq.resize(128).unwrap();
    assert!((128..before).contains(&granted), "shrunk from {before} to {granted}");
    assert_eq!(b.cq.cqe(), granted);
    let free = granted - 128;
    // A QP that needs one entry more than is free on the resized CQ is refused.
    let e = QueuePair::builder(&pd, QpType::Rc, &b.cq, &b.cq).max_send_wr(free + 1).max_recv_wr(1).build();
    let e = e.expect_err("a QP that does not fit besides the reservations");
    assert!(matches!(e, Error::InvalidArgument { verb: Verb::QueuePairBuilderBuild, .. }), "{e:?}");
    assert!(e.to_string().contains(&format!("its CQ has {granted} entries and 128 of them are reserved")), "{e}");

    // Dropping the queues gives their entries back: now it shrinks below 128.
    let (bq, brq) = (b.sq, b.rq);
    drop((bq, brq));
    let small = b.cq.resize(16).unwrap();
    assert!(small >= 16 && small < granted, "{small}");
    drop((a, b.qp));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn cq_moderation_on_a_device_without_it_is_a_typed_not_supported_naming_cq_mod_caps() {
    let _leaks = LeakCheck::new();
    let ctx = crate::open();
    let mut cq = CompletionQueue::builder(&ctx, 16).with_channel().build().unwrap();
    let is_rxe = ctx.name().starts_with("rxe");
    match cq.set_moderation(16, 10) {
        Err(e @ Error::NotSupported { .. }) => {
            let text = e.to_string();
            eprintln!("set_moderation: {text}");
            match e {
                Error::NotSupported { verb: Verb::CqSetModeration, errno: None, .. } => {
                    assert!(text.contains("cq_mod_caps.max_cq_count 0"), "{text}");
                    assert!(
                        text.starts_with("CompletionQueue::set_moderation: not supported by this device"),
                        "{text}"
                    );
                }
                Error::NotSupported { verb: Verb::ModifyCq, errno: Some(errno), .. } => {
                    assert!(errno == libc::EOPNOTSUPP || errno == libc::ENOSYS, "{text}");
                    assert!(text.starts_with("ibv_modify_cq: not supported by this device"), "{text}");
                }
                other => panic!("unexpected {other:?}"),
            }
            assert!(e.errno().is_none() || e.verb_of() == Some(Verb::ModifyCq));
        }
        Ok(()) => assert!(!is_rxe, "rxe has no CQ moderation, yet set_moderation succeeded"),
        Err(other) => panic!("set_moderation: {other}"),
    }
    if is_rxe {
        // What rxe's C side says when asked anyway: its provider has no modify_cq.
        let mut attr = ffi::ibv_modify_cq_attr {
            attr_mask: ffi::ibv_cq_attr_mask::IBV_CQ_ATTR_MODERATE.0,
            moderate: ffi::ibv_moderate_cq { cq_count: 16, cq_period: 10 },
        };
        // SAFETY: the CQ is live and `attr` is valid for the call.
        let rc = unsafe { ffi::ibv_modify_cq(cq.as_raw(), &mut attr) };
        eprintln!("rxe: ibv_modify_cq returned {rc}");
        assert_eq!(rc, libc::EOPNOTSUPP, "rxe's ibv_modify_cq");
    }
    // The CQ is unchanged and usable.
    cq.arm(false).unwrap();
    assert!(cq.poll_one().unwrap().is_none());
}
