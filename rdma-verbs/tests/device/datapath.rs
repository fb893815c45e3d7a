//! The safe data path on a real device: two RC QPs on one device connected to each
//! other, every byte that arrives compared with what was sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::Chunk;
use rdma_verbs::QueuePairBuilder;
use rdma_verbs::{
    AccessFlags, AlignedBuf, CompletionQueue, InitAttr, ProtectionDomain, QpAccess, QpType, QueuePair, WcOpcode,
    WcStatus, WorkCompletion,
};
use rdma_verbs::{Done, RecvQueue, SendQueue, SendWr};

use crate::{connect_rc, open, LeakCheck, Link};

/// One side of a loopback connection: a QP with its own CQ and both of its queues.
pub struct Side<T: rdma_verbs::SendBuf> {
    pub cq: CompletionQueue,
    pub sq: SendQueue<T>,
    pub rq: RecvQueue<Chunk>,
    pub qp: QueuePair,
    /// What keeps the connection up (rdma_cm's ids on iWARP), shared by both sides.
    pub link: Arc<Link>,
}

/// Two connected RC QPs on the device under test, and the PD their memory comes from.
pub fn rc_pair<T: rdma_verbs::SendBuf>(access: QpAccess) -> (ProtectionDomain, Side<T>, Side<T>) {
    rc_pair_with(access, |b| b)
}

/// The `max_send_wr` and `max_recv_wr` [`rc_pair`] builds its QPs with: the depth of their
/// queues (a provider may grant more, as rxe does from Linux 6.2: `caps()` says so).
pub const PAIR_DEPTH: u32 = 64;

/// [`rc_pair`] with QPs built by `tune` from a builder with [`PAIR_DEPTH`] WRs each way.
pub fn rc_pair_with<T: rdma_verbs::SendBuf>(
    access: QpAccess,
    tune: impl Fn(QueuePairBuilder<'_>) -> QueuePairBuilder<'_>,
) -> (ProtectionDomain, Side<T>, Side<T>) {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let make = || {
        let cq = CompletionQueue::new(&ctx, 256).unwrap();
        let b = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(PAIR_DEPTH).max_recv_wr(PAIR_DEPTH);
        let qp = tune(b).build().unwrap();
        (cq, qp)
    };
    let (cq_a, a) = make();
    let (cq_b, b) = make();
    let init = InitAttr { access, ..InitAttr::default() };
    let link = Arc::new(connect_rc(&a, &b, &init));
    let side = |cq, qp: QueuePair| Side {
        sq: qp.send_queue().unwrap(),
        rq: qp.recv_queue().unwrap(),
        cq,
        qp,
        link: Arc::clone(&link),
    };
    (pd, side(cq_a, a), side(cq_b, b))
}

/// Registers `n` chunks of `len` bytes each in one region.
pub fn chunks(pd: &ProtectionDomain, n: usize, len: usize, access: AccessFlags) -> Vec<Chunk> {
    pd.register(AlignedBuf::new(n * len).unwrap(), access).unwrap().into_chunks(len).unwrap()
}

/// Polls until one completion arrives (bounded: a lost completion fails the test).
pub fn poll_one(cq: &mut CompletionQueue) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [WorkCompletion::EMPTY; 1];
    loop {
        if let Some(w) = cq.poll(&mut wc).unwrap().first_mut() {
            return std::mem::take(w);
        }
        assert!(Instant::now() < deadline, "no completion within 10 s");
        std::hint::spin_loop();
    }
}

/// Pseudo-random bytes (xorshift, from `seed`): no short period, so data in the wrong
/// place, or a shifted copy, does not compare equal.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn send_done<T: rdma_verbs::SendBuf>(side: &mut Side<T>) -> Vec<Done<T>> {
    let mut wc = poll_one(&mut side.cq);
    let mut out = Vec::new();
    side.sq.complete(&mut wc, |d| out.push(d)).unwrap();
    out
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn send_delivers_exact_bytes_and_both_buffers_come_back() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    let mut bufs = chunks(&pd, 2, 4096, AccessFlags::LOCAL_WRITE);
    let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
    let data = pattern(7, 3000);
    src[..3000].copy_from_slice(&data);
    b.rq.post(dst, 0..4096, 42).unwrap();
    a.sq.post(SendWr::send(src, 0..3000).imm(0xfeed).id(9)).unwrap();

    let sent = send_done(&mut a);
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].id, sent[0].status), (9, WcStatus::Success));
    let mut wc = poll_one(&mut b.cq);
    assert_eq!(wc.opcode(), WcOpcode::Recv);
    assert_eq!(wc.imm_data(), Some(0xfeed));
    let got = b.rq.complete(&mut wc).unwrap();
    assert_eq!((got.id, got.status, got.byte_len), (42, WcStatus::Success, 3000));
    assert_eq!(&got.value[..3000], &data[..]);
    // A completion is taken once: the same one again is refused.
    assert!(b.rq.complete(&mut wc).is_err());
    assert_eq!(a.sq.outstanding() + b.rq.outstanding(), 0);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn rdma_write_read_and_atomics_move_the_right_bytes() {
    let _leaks = LeakCheck::new();
    let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC;
    let (pd, mut a, b) = rc_pair::<Chunk>(access);
    // The target region on B, remote-writable: read back through its safe accessors.
    let target = pd
        .register_remote_writable(
            AlignedBuf::new(8192).unwrap(),
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let remote = target.remote().unwrap();
    let mut bufs = chunks(&pd, 3, 4096, AccessFlags::LOCAL_WRITE);
    let (mut src, rd, atom) = (bufs.remove(0), bufs.remove(0), bufs.remove(0));
    let data = pattern(3, 4096);
    src.copy_from_slice(&data);

    // WRITE 4096 bytes at offset 100 of the target.
    a.sq.post(SendWr::write(src, 0..4096, remote.slice(100..).unwrap())).unwrap();
    let src = send_done(&mut a).pop().unwrap().value;
    let mut got = vec![0u8; 4096];
    target.read_at(100, &mut got).unwrap();
    assert_eq!(got, data);
    let mut edge = [0u8; 100];
    target.read_at(0, &mut edge).unwrap();
    assert_eq!(edge, [0u8; 100], "bytes before the write are untouched");

    // READ them back into a local chunk.
    a.sq.post(SendWr::read(rd, 0..4096, remote.slice(100..).unwrap())).unwrap();
    let rd = send_done(&mut a).pop().unwrap();
    assert_eq!(rd.status, WcStatus::Success);
    assert_eq!(&rd.value[..], &data[..]);

    // Atomics on the 8 bytes at offset 8192-8: old values land in the local chunk.
    let word = remote.slice(8184..).unwrap();
    target.atomic_u64(8184).unwrap().store(100, std::sync::atomic::Ordering::SeqCst);
    a.sq.post(SendWr::fetch_add(atom, 0, word, 5)).unwrap();
    let atom = send_done(&mut a).pop().unwrap().value;
    assert_eq!(u64::from_ne_bytes(atom[..8].try_into().unwrap()), 100);
    a.sq.post(SendWr::compare_swap(atom, 0, word, 105, 7)).unwrap();
    let atom = send_done(&mut a).pop().unwrap().value;
    assert_eq!(u64::from_ne_bytes(atom[..8].try_into().unwrap()), 105);
    assert_eq!(target.atomic_u64(8184).unwrap().load(std::sync::atomic::Ordering::SeqCst), 7);
    drop((src, b));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_batch_of_unsignaled_writes_is_released_by_its_one_signaled_completion() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, _b) = rc_pair::<Arc<Chunk>>(QpAccess::REMOTE_WRITE);
    let target = pd
        .register_remote_writable(
            AlignedBuf::new(32 * 64).unwrap(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let mut src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    src.copy_from_slice(&pattern(9, 64));
    let src = Arc::new(src);
    let remote = target.remote().unwrap();
    // 32 writes of the same shared source, one provider call, only the last signaled.
    let wrs = (0..32u64)
        .map(|i| SendWr::write(Arc::clone(&src), 0..64, remote.slice(i * 64..).unwrap()).id(i).signaled(i == 31));
    assert_eq!(a.sq.post_batch(wrs).unwrap(), 32);
    assert_eq!(a.sq.outstanding(), 32);
    let done = send_done(&mut a);
    assert_eq!(done.iter().map(|d| d.id).collect::<Vec<_>>(), (0..32).collect::<Vec<_>>());
    assert!(done.iter().all(|d| d.status == WcStatus::Success));
    drop(done);
    assert_eq!(Arc::strong_count(&src), 1, "every clone came back");
    let mut got = vec![0u8; 32 * 64];
    target.read_at(0, &mut got).unwrap();
    for slot in got.chunks(64) {
        assert_eq!(slot, &pattern(9, 64)[..]);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn error_state_flushes_every_outstanding_receive_once_and_returns_the_buffers() {
    let _leaks = LeakCheck::new();
    let (pd, _a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    for (i, c) in chunks(&pd, 5, 256, AccessFlags::LOCAL_WRITE).into_iter().enumerate() {
        b.rq.post(c, 0..256, i as u64).unwrap();
    }
    b.qp.to_error().unwrap();
    let mut ids = Vec::new();
    while ids.len() < 5 {
        let mut wc = poll_one(&mut b.cq);
        let done = b.rq.complete(&mut wc).unwrap();
        assert_eq!(done.status, WcStatus::WrFlushErr);
        ids.push(done.id);
    }
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    let mut wc = [WorkCompletion::EMPTY; 4];
    std::thread::sleep(Duration::from_millis(100));
    assert!(b.cq.poll(&mut wc).unwrap().is_empty(), "no completion twice");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn dropping_queues_with_receives_posted_frees_them_after_the_qp() {
    let _leaks = LeakCheck::new();
    let (pd, a, mut b) = rc_pair::<Chunk>(QpAccess::empty());
    for c in chunks(&pd, 4, 128, AccessFlags::LOCAL_WRITE) {
        b.rq.post(c, 0..128, 0).unwrap();
    }
    // The queue goes first, the QP later: the buffers wait for ibv_destroy_qp.
    drop(b.rq);
    let second = b.qp.recv_queue::<Chunk>();
    assert!(second.is_ok(), "the receive side can be claimed again once released");
    drop((second, b.sq, b.qp, b.cq, a, pd));
}
