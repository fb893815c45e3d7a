//! RDMA ATOMIC WRITE (IBTA 1.5, `SendWr::atomic_write`): rxe has it from Linux 6.2. On
//! the test bed's default kernel (6.1) every test here checks the refusal before C; on
//! 6.12 (`scripts/rxe --kernel 6.12`, the phase "kernel 6.12" of scripts/test) the bytes.
//! Which of the two a device must give is not read from the device alone: for rxe the
//! kernel's release decides, and the device's capability bit must agree with it.

use std::sync::atomic::Ordering;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Error, MemoryRegion, ProtectionDomain, QpAccess, QpType,
    QueuePair, RemoteMr, RemoteWritable, SendOps, SendWr, Verb, WcOpcode, WcStatus,
};

use crate::datapath::{chunks, poll_one, rc_pair_with};
use crate::{open, LeakCheck};

/// `IB_UVERBS_DEVICE_ATOMIC_WRITE` in `device_cap_flags_ex` (Linux 6.2's ib_user_verbs.h).
const CAP_BIT: u64 = 1 << 40;

/// Whether the device under test must have RDMA ATOMIC WRITE: for rxe, whether the running
/// kernel is 6.2 or later (and its capability bit must say the same); for another device,
/// its capability bit.
fn must_have_atomic_write(ctx: &Context) -> bool {
    let cap = ctx.query_device_ex().unwrap().device_cap_flags_ex & CAP_BIT != 0;
    if !ctx.name().starts_with("rxe") {
        return cap;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release.trim().split(['.', '-', '+']).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap(), v.next().unwrap());
    let kernel_has_it = (major, minor) >= (6, 2);
    assert_eq!(cap, kernel_has_it, "rxe on Linux {}: the capability bit says {cap}", release.trim());
    eprintln!("Linux {}: rxe has RDMA ATOMIC WRITE: {kernel_has_it}", release.trim());
    kernel_has_it
}

/// A region A's peer may write (REMOTE_WRITE only: what rxe asks of an ATOMIC WRITE's
/// target, as of an RDMA WRITE's), 4 KiB of 0x11.
fn target(pd: &ProtectionDomain) -> MemoryRegion<AlignedBuf, RemoteWritable> {
    let mut buf = AlignedBuf::new(4096).unwrap();
    buf.fill(0x11);
    pd.register_remote_writable(buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap()
}

/// An RC QP, not connected, built with `ops` (or classic), on a fresh CQ.
fn lone_qp(pd: &ProtectionDomain, ops: Option<SendOps>) -> Result<(CompletionQueue, QueuePair), Error> {
    let cq = CompletionQueue::new(pd.context(), 64).unwrap();
    let mut b = QueuePair::builder(pd, QpType::Rc, &cq, &cq).max_send_wr(8).max_recv_wr(8);
    if let Some(ops) = ops {
        b = b.extended_send_ops(ops);
    }
    b.build().map(|qp| (cq, qp))
}

/// Whether every byte of the target is still 0x11.
fn untouched(t: &MemoryRegion<AlignedBuf, RemoteWritable>) -> bool {
    let mut mem = vec![0; 4096];
    t.read_at(0, &mut mem).unwrap();
    mem.iter().all(|&b| b == 0x11)
}

fn assert_not_supported(e: &Error, verb: Verb) {
    assert!(matches!(e, Error::NotSupported { verb: v, .. } if *v == verb), "{e:?}");
    assert!(e.to_string().contains("IB_UVERBS_DEVICE_ATOMIC_WRITE"), "{e}");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn atomic_write_puts_its_8_bytes_at_the_peer_or_is_not_supported_naming_the_capability() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    if !must_have_atomic_write(&ctx) {
        // Refused before C twice: the QP that asks for the send op, and the post on a QP
        // without it (the buffer comes back).
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let e = lone_qp(&pd, Some(SendOps::ATOMIC_WRITE | SendOps::RDMA_WRITE)).unwrap_err();
        assert_not_supported(&e, Verb::QueuePairBuilderBuild);
        let (_cq, qp) = lone_qp(&pd, None).unwrap();
        let mut sq = qp.send_queue::<Chunk>().unwrap();
        let t = target(&pd);
        let src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
        let refused = sq.post(SendWr::atomic_write(src, 0, t.remote().unwrap())).unwrap_err();
        assert_not_supported(&refused.error, Verb::SendQueuePost);
        assert_eq!(refused.value.into_buf().len(), 64, "the buffer came back");
        assert!(untouched(&t), "nothing was written");
        return;
    }
    let ops = SendOps::ATOMIC_WRITE | SendOps::RDMA_WRITE;
    let (pd, mut a, _b) = rc_pair_with::<Chunk>(QpAccess::REMOTE_WRITE, |q| q.extended_send_ops(ops));
    assert!(a.sq.uses_extended_api());
    let t = target(&pd);
    let word = t.remote().unwrap().slice(1024..1032).unwrap();
    let mut src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let bytes = 0x0123_4567_89ab_cdef_u64.to_le_bytes();
    src[16..24].copy_from_slice(&bytes);
    a.sq.post(SendWr::atomic_write(src, 16, word).id(7)).unwrap_or_else(|r| panic!("{}", r.error));
    let mut wc = poll_one(&mut a.cq);
    let mut done = Vec::new();
    a.sq.complete(&mut wc, |d| done.push(d)).unwrap();
    let d = done.pop().unwrap();
    assert_eq!((d.status, d.op, d.id), (WcStatus::Success, WcOpcode::AtomicWrite, 7), "{d:?}");
    let mut mem = vec![0; 4096];
    t.read_at(0, &mut mem).unwrap();
    assert_eq!(&mem[1024..1032], &bytes, "the 8 bytes at the peer");
    eprintln!("atomic write: the peer's 8 bytes at offset 1024 read {:02x?}", &mem[1024..1032]);
    assert!(mem[..1024].iter().chain(&mem[1032..]).all(|&b| b == 0x11), "nothing else was written");
    // The word as the peer's CPU sees it: one 8-byte value.
    assert_eq!(t.atomic_u64(1024).unwrap().load(Ordering::SeqCst), u64::from_le_bytes(bytes));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn atomic_write_to_a_misaligned_remote_address_is_refused_before_c_and_writes_nothing() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let has = must_have_atomic_write(&ctx);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    // Where the device has it, on a QP built for it; else on a classic QP: the alignment
    // is checked first either way.
    let (_cq, qp) = lone_qp(&pd, has.then_some(SendOps::ATOMIC_WRITE)).unwrap();
    let mut sq = qp.send_queue::<Chunk>().unwrap();
    let t = target(&pd);
    let r = t.remote().unwrap();
    let src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    let refused = sq.post(SendWr::atomic_write(src, 0, RemoteMr { addr: r.addr + 4, ..r })).unwrap_err();
    assert!(matches!(refused.error, Error::InvalidArgument { verb: Verb::SendQueuePost, .. }), "{:?}", refused.error);
    assert!(refused.error.to_string().contains("8-byte aligned remote address"), "{}", refused.error);
    assert!(untouched(&t), "nothing was written");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn atomic_write_without_the_send_op_or_prepared_is_refused_before_c() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let has = must_have_atomic_write(&ctx);
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let t = target(&pd);
    let word = t.remote().unwrap().slice(0..8).unwrap();
    let src = || chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    // A QP built with other send ops, and a classic one.
    for ops in [Some(SendOps::RDMA_WRITE), None] {
        let (_cq, qp) = lone_qp(&pd, ops).unwrap();
        let mut sq = qp.send_queue::<Chunk>().unwrap();
        let e = sq.post(SendWr::atomic_write(src(), 0, word)).unwrap_err().error;
        if has {
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::SendQueuePost, .. }), "{e:?}");
            assert!(e.to_string().contains("extended_send_ops(SendOps::ATOMIC_WRITE)"), "{e}");
        } else {
            assert_not_supported(&e, Verb::SendQueuePost);
        }
    }
    // A prepared request goes through ibv_post_send, even on a QP built for the send op.
    let (_cq, qp) = lone_qp(&pd, has.then_some(SendOps::ATOMIC_WRITE)).unwrap();
    let sq = qp.prepared_send_queue::<Chunk>().unwrap();
    let e = sq.prepare(SendWr::atomic_write(src(), 0, word)).unwrap_err().error;
    if has {
        assert!(matches!(e, Error::InvalidArgument { verb: Verb::SendQueuePrepare, .. }), "{e:?}");
        assert!(e.to_string().contains("a prepared request goes through ibv_post_send"), "{e}");
    } else {
        assert_not_supported(&e, Verb::SendQueuePrepare);
    }
    assert!(untouched(&t), "nothing was written");
}
