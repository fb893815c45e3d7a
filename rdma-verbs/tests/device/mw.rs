//! Memory windows on a real device: a window bound through the owner's send queue lets the
//! peer RDMA WRITE and READ exactly its range with the window's rkey; once the binding
//! ends (a local invalidate, a type 1 bind of length 0, or the peer's send with
//! invalidate) the device refuses the old rkey with a remote access error and no byte
//! changes; the window deallocates afterwards. Misuse is refused before C, nothing posted.
//!
//! B owns the memory and the window (its send queue is an `MwSendQueue`); A is the peer,
//! with an ordinary send queue. The peer's descriptor goes through the wire form, as it
//! would between two hosts.

use std::sync::Arc;

use rdma_verbs::{
    AccessFlags, AlignedBuf, BoundWindow, Chunk, CompletionQueue, Error, InitAttr, MemoryRegion, MemoryWindow, MwBind,
    MwDone, MwRequest, MwSendQueue, MwType, ProtectionDomain, QpAccess, QpType, QueuePair, RecvQueue, RemoteMr,
    RemoteWritable, SendOps, SendQueue, SendWr, Verb, WcOpcode, WcStatus,
};

use crate::datapath::{chunks, poll_one};
use crate::{open, LeakCheck};

type Region = Arc<MemoryRegion<AlignedBuf, RemoteWritable>>;

/// A, the peer: an ordinary send queue.
struct Peer {
    cq: CompletionQueue,
    sq: SendQueue<Chunk>,
    _qp: QueuePair,
}

/// B, the owner of the memory and the window.
struct Owner {
    cq: CompletionQueue,
    sq: MwSendQueue<Chunk>,
    rq: RecvQueue<Chunk>,
    _qp: QueuePair,
}

/// Two connected RC QPs (every remote operation allowed on the QPs: the window decides).
fn pair() -> (ProtectionDomain, Peer, Owner) {
    pair_with(false)
}

/// [`pair`], with QPs built with the send ops windows use when `ext` (so their queues post
/// through `ibv_wr_bind_mw`, `ibv_wr_local_inv` and `ibv_wr_send_inv`).
fn pair_with(ext: bool) -> (ProtectionDomain, Peer, Owner) {
    let ctx = open();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let ops = SendOps::SEND
        | SendOps::SEND_WITH_INV
        | SendOps::RDMA_WRITE
        | SendOps::RDMA_READ
        | SendOps::BIND_MW
        | SendOps::LOCAL_INV;
    let make = || {
        let cq = CompletionQueue::new(&ctx, 64).unwrap();
        let mut qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(16).max_recv_wr(16);
        if ext {
            qp = qp.extended_send_ops(ops);
        }
        let qp = qp.build().unwrap();
        (cq, qp)
    };
    let ((cq_a, a), (cq_b, b)) = (make(), make());
    let access = QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC;
    let init = InitAttr { access, ..InitAttr::default() };
    let (ia, ib) = (a.local_info(1).unwrap(), b.local_info(1).unwrap());
    a.connect(&init, &ib).unwrap();
    b.connect(&init, &ia).unwrap();
    let peer = Peer { sq: a.send_queue().unwrap(), cq: cq_a, _qp: a };
    let owner = Owner { sq: b.mw_send_queue().unwrap(), rq: b.recv_queue().unwrap(), cq: cq_b, _qp: b };
    assert_eq!((peer.sq.uses_extended_api(), owner.sq.uses_extended_api()), (ext, ext));
    (pd, peer, owner)
}

/// 4 KiB for windows: every byte even (a byte the peer's odd source wrote shows).
fn region(pd: &ProtectionDomain, access: AccessFlags) -> Region {
    let mut mr = pd.register_remote_writable(AlignedBuf::new(4096).unwrap(), access).unwrap();
    let bytes: Vec<u8> = (0..4096).map(|i| (i as u8).wrapping_mul(3) & 0xfe).collect();
    mr.write_at(0, &bytes).unwrap();
    Arc::new(mr)
}

fn window_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND
}

fn snapshot(r: &Region) -> Vec<u8> {
    let mut out = vec![0u8; r.len()];
    r.read_at(0, &mut out).unwrap();
    out
}

/// The owner's next completion, taken by its queue.
fn owner_done(b: &mut Owner) -> rdma_verbs::Done<MwDone<Chunk>> {
    let mut wc = poll_one(&mut b.cq);
    let mut done = None;
    b.sq.complete(&mut wc, |d| done = Some(d)).unwrap();
    done.expect("the completion hands back its request")
}

fn bind(b: &mut Owner, w: MemoryWindow, r: &Region, range: std::ops::Range<usize>, id: u64) -> BoundWindow {
    b.sq.bind_mw(MwBind::new(w, r, range, AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ).id(id)).unwrap();
    let done = owner_done(b);
    assert_eq!((done.id, done.status, done.op), (id, WcStatus::Success, WcOpcode::BindMw));
    done.value.into_bound().expect("a bind hands back the bound window")
}

fn invalidate(b: &mut Owner, w: BoundWindow, id: u64) -> MemoryWindow {
    let ty = w.mw_type();
    b.sq.invalidate_mw(w, id).unwrap();
    let done = owner_done(b);
    let op = if ty == MwType::Type1 { WcOpcode::BindMw } else { WcOpcode::LocalInv };
    assert_eq!((done.id, done.status, done.op), (id, WcStatus::Success, op));
    let w = done.value.into_unbound().expect("an invalidation hands back the window");
    assert!(w.is_clear());
    w
}

/// The peer's WRITE of `len` odd bytes to `remote`, and its completion status.
fn peer_write(pd: &ProtectionDomain, a: &mut Peer, remote: RemoteMr, len: usize) -> WcStatus {
    let mut src = chunks(pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
    for (j, x) in src.iter_mut().enumerate() {
        *x = (j as u8 ^ 0x5a) | 1;
    }
    a.sq.post(SendWr::write(src, 0..len, remote).id(1)).unwrap();
    let mut wc = poll_one(&mut a.cq);
    let mut status = None;
    a.sq.complete(&mut wc, |d| status = Some(d.status)).unwrap();
    status.unwrap()
}

/// The peer's READ of `len` bytes from `remote`: its status and the bytes.
fn peer_read(pd: &ProtectionDomain, a: &mut Peer, remote: RemoteMr, len: usize) -> (WcStatus, Vec<u8>) {
    let dst = chunks(pd, 1, 4096, AccessFlags::LOCAL_WRITE).pop().unwrap();
    a.sq.post(SendWr::read(dst, 0..len, remote).id(2)).unwrap();
    let mut wc = poll_one(&mut a.cq);
    let mut got = None;
    a.sq.complete(&mut wc, |d| got = Some((d.status, d.value[..len].to_vec()))).unwrap();
    got.unwrap()
}

/// What the peer receives: the window's descriptor in its wire form.
fn over_the_wire(w: &BoundWindow) -> RemoteMr {
    RemoteMr::from_bytes(&w.key().remote().to_bytes()).unwrap()
}

/// How a test ends a binding.
type End = fn(&mut Owner, &mut Peer, &ProtectionDomain, BoundWindow) -> MemoryWindow;

/// Bind [1024, 2048), the peer writes 200 bytes at offset 100 of the window and reads them
/// back; the binding ends (`end`); the peer's write with the old rkey is refused and no
/// byte changes; the window deallocates.
fn bound_window_admits_the_peer_until_it_ends(ty: MwType, ext: bool, end: End) {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = pair_with(ext);
    let r = region(&pd, window_access());
    let before = snapshot(&r);
    let w = pd.alloc_mw(ty).unwrap();
    assert_eq!(w.mw_type(), ty);
    let bound = bind(&mut b, w, &r, 1024..2048, 5);
    let remote = over_the_wire(&bound);
    assert_eq!((remote.addr, remote.len), (r.addr() + 1024, 1024));
    assert_ne!(remote.rkey, r.rkey(), "a window has its own rkey");

    assert_eq!(peer_write(&pd, &mut a, remote.slice(100..300).unwrap(), 200), WcStatus::Success);
    let after = snapshot(&r);
    let written: Vec<u8> = (0..200).map(|j| (j as u8 ^ 0x5a) | 1).collect();
    assert_eq!(&after[1124..1324], &written[..], "the peer's bytes arrived through the window");
    assert_eq!(&after[..1124], &before[..1124]);
    assert_eq!(&after[1324..], &before[1324..]);
    let (status, read) = peer_read(&pd, &mut a, remote.slice(100..300).unwrap(), 200);
    assert_eq!((status, &read[..]), (WcStatus::Success, &written[..]), "the peer reads through the window");

    let w = end(&mut b, &mut a, &pd, bound);
    // The old rkey is refused now, and nothing changes.
    assert_eq!(peer_write(&pd, &mut a, remote, 64), WcStatus::RemAccessErr);
    assert_eq!(snapshot(&r), after, "a refused write changed bytes");
    w.destroy().unwrap();
    // The window let the region go: this test holds the last reference.
    assert_eq!(Arc::strong_count(&r), 1);
    eprintln!("{ty:?} window {:#x}: peer admitted while bound, refused after", remote.rkey);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_type1_bound_window_admits_the_peer_until_a_zero_length_bind_ends_it() {
    bound_window_admits_the_peer_until_it_ends(MwType::Type1, false, |b, _, _, w| invalidate(b, w, 6));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_type2_bound_window_admits_the_peer_until_a_local_invalidate_ends_it() {
    bound_window_admits_the_peer_until_it_ends(MwType::Type2, false, |b, _, _, w| invalidate(b, w, 6));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_type2_send_with_invalidate_from_the_peer_ends_the_binding() {
    bound_window_admits_the_peer_until_it_ends(MwType::Type2, false, send_with_invalidate);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_extended_qp_binds_invalidates_and_sends_with_invalidate_through_ibv_wr() {
    bound_window_admits_the_peer_until_it_ends(MwType::Type2, true, |b, _, _, w| invalidate(b, w, 6));
    bound_window_admits_the_peer_until_it_ends(MwType::Type2, true, send_with_invalidate);
    // Type 1 binds go through ibv_bind_mw on an extended QP as well.
    bound_window_admits_the_peer_until_it_ends(MwType::Type1, true, |b, _, _, w| invalidate(b, w, 6));
}

/// The peer's send with invalidate of `w`'s rkey ends the binding; the owner's receive
/// completion proves it.
fn send_with_invalidate(b: &mut Owner, a: &mut Peer, pd: &ProtectionDomain, w: BoundWindow) -> MemoryWindow {
    {
        let rkey = w.key().rkey();
        let dst = chunks(pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
        b.rq.post(dst, 0..64, 9).unwrap();
        let src = chunks(pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
        a.sq.post(SendWr::send_inv(src, 0..16, rkey).id(3)).unwrap();
        let mut wc = poll_one(&mut a.cq);
        a.sq.complete(&mut wc, |d| assert_eq!((d.id, d.status), (3, WcStatus::Success))).unwrap();
        let mut wc = poll_one(&mut b.cq);
        eprintln!("the receive of the send with invalidate: {wc:?}");
        let got = b.rq.complete(&mut wc).unwrap();
        assert_eq!((got.id, got.status, got.byte_len), (9, WcStatus::Success, 16));
        let w = w.invalidated_by(&wc).unwrap();
        assert!(w.is_clear());
        w
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_a_completion_that_invalidated_nothing_does_not_unbind_a_window() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = pair();
    let r = region(&pd, window_access());
    let bound = bind(&mut b, pd.alloc_mw(MwType::Type2).unwrap(), &r, 0..4096, 5);
    let dst = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    b.rq.post(dst, 0..64, 9).unwrap();
    let src = chunks(&pd, 1, 64, AccessFlags::LOCAL_WRITE).pop().unwrap();
    a.sq.post(SendWr::send(src, 0..16).id(3)).unwrap();
    let mut sent = poll_one(&mut a.cq);
    a.sq.complete(&mut sent, |_| ()).unwrap();
    // A completion of another QP (the peer's) says nothing about this window.
    let refused = bound.invalidated_by(&sent).unwrap_err();
    assert!(refused.error.to_string().contains("the window was bound on QP"), "{}", refused.error);
    let bound = refused.into_value();
    let mut wc = poll_one(&mut b.cq);
    b.rq.complete(&mut wc).unwrap();
    let refused = bound.invalidated_by(&wc).unwrap_err();
    assert!(matches!(refused.error, Error::InvalidArgument { verb: Verb::BoundWindowInvalidatedBy, .. }));
    assert!(refused.error.to_string().contains("not this window's rkey"), "{}", refused.error);
    let bound = refused.into_value();
    // Still bound: the peer still gets in.
    assert_eq!(peer_write(&pd, &mut a, over_the_wire(&bound), 8), WcStatus::Success);
    let w = invalidate(&mut b, bound, 6);
    w.destroy().unwrap();
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_dealloc_of_a_bound_window_ends_the_binding() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = pair();
    let r = region(&pd, window_access());
    let bound = bind(&mut b, pd.alloc_mw(MwType::Type2).unwrap(), &r, 0..512, 5);
    let remote = over_the_wire(&bound);
    let before = snapshot(&r);
    bound.destroy().unwrap();
    assert_eq!(Arc::strong_count(&r), 1);
    assert_eq!(peer_write(&pd, &mut a, remote, 64), WcStatus::RemAccessErr);
    assert_eq!(snapshot(&r), before);
}

/// A refusal before C: the error names `verb` and says nothing was posted.
fn refused_before_c(e: &Error, verb: Verb, says: &str) {
    let text = e.to_string();
    assert!(matches!(e, Error::InvalidArgument { verb: v, .. } if *v == verb), "{text}");
    assert!(text.contains("nothing posted"), "{text}");
    assert!(text.contains(says), "{text:?} does not say {says:?}");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_misuse_is_refused_before_c_with_nothing_posted() {
    let _leaks = LeakCheck::new();
    let (pd, _a, mut b) = pair();
    let r = region(&pd, window_access());
    let rw = AccessFlags::REMOTE_WRITE;
    let try_bind = |b: &mut Owner, w: MemoryWindow, r: &Region, range, access| {
        let refused = b.sq.bind_mw(MwBind::new(w, r, range, access)).unwrap_err();
        assert_eq!(b.sq.outstanding(), 0);
        let (error, bind) = refused.into_parts();
        (error, bind.into_window())
    };
    for ty in [MwType::Type1, MwType::Type2] {
        let verb = if ty == MwType::Type1 { Verb::SendQueueBindMwType1 } else { Verb::SendQueueBindMw };
        let w = pd.alloc_mw(ty).unwrap();
        // A range outside the region, and an empty one.
        let (e, w) = try_bind(&mut b, w, &r, 4000..5000, rw);
        refused_before_c(&e, verb, "outside the region's 4096 bytes");
        let (e, w) = try_bind(&mut b, w, &r, 10..10, rw);
        refused_before_c(&e, verb, "empty");
        // A region without MW_BIND.
        let plain = region(&pd, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let (e, w) = try_bind(&mut b, w, &plain, 0..64, rw);
        refused_before_c(&e, verb, "without MW_BIND");
        // Rights a window cannot grant, and none.
        let (e, w) = try_bind(&mut b, w, &r, 0..64, AccessFlags::LOCAL_WRITE);
        refused_before_c(&e, verb, "a window grants");
        let (e, w) = try_bind(&mut b, w, &r, 0..64, AccessFlags::empty());
        refused_before_c(&e, verb, "a window grants");
        // Remote write on a region without LOCAL_WRITE.
        let bare = region(&pd, AccessFlags::MW_BIND);
        let (e, w) = try_bind(&mut b, w, &bare, 0..64, rw);
        refused_before_c(&e, verb, "need LOCAL_WRITE");
        // A window of another PD, and a region of another PD.
        let other = ProtectionDomain::new(pd.context()).unwrap();
        let (e, foreign) = try_bind(&mut b, other.alloc_mw(ty).unwrap(), &r, 0..64, rw);
        refused_before_c(&e, verb, "window was allocated in another protection domain");
        drop(foreign);
        let far = region(&other, window_access());
        let (e, w) = try_bind(&mut b, w, &far, 0..64, rw);
        refused_before_c(&e, verb, "region is registered in another protection domain");
        // Everything right: bound; and once invalidated, bound again (with a new rkey).
        let bound = bind(&mut b, w, &r, 0..64, 5);
        let first = bound.key().rkey();
        let w = invalidate(&mut b, bound, 6);
        let bound = bind(&mut b, w, &r, 64..128, 7);
        assert_ne!(bound.key().rkey(), first);
        invalidate(&mut b, bound, 8).destroy().unwrap();
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn mw_wrong_window_type_for_the_call_is_refused_before_c() {
    let _leaks = LeakCheck::new();
    let (pd, _a, mut b) = pair();
    let r = region(&pd, window_access());
    // A type 1 window binds through ibv_bind_mw, never as a posted request.
    let w = pd.alloc_mw(MwType::Type1).unwrap();
    let bind1 = MwBind::new(w, &r, 0..64, AccessFlags::REMOTE_READ);
    let e = b.sq.post(MwRequest::Bind(bind1)).unwrap_err();
    refused_before_c(&e.error, Verb::SendQueuePost, "a type 1 window binds with SendQueue::bind_mw");
    let MwRequest::Bind(bind1) = e.into_value() else { panic!("the bind comes back") };
    let bound = bind(&mut b, bind1.into_window(), &r, 0..64, 5);
    // A type 1 window has no local invalidate.
    let e = b.sq.post(MwRequest::LocalInv { window: bound, id: 7 }).unwrap_err();
    refused_before_c(&e.error, Verb::SendQueuePost, "a type 1 window has no local invalidate");
    let MwRequest::LocalInv { window: bound, .. } = e.into_value() else { panic!("the window comes back") };
    assert_eq!(b.sq.outstanding(), 0);
    invalidate(&mut b, bound, 6).destroy().unwrap();

    // A type 2 bind and local invalidate posted as requests, in one batch with a write.
    let w = pd.alloc_mw(MwType::Type2).unwrap();
    b.sq.post(MwRequest::Bind(MwBind::new(w, &r, 0..64, AccessFlags::REMOTE_READ).id(8))).unwrap();
    let bound = owner_done(&mut b).result().unwrap().value.into_bound().unwrap();
    b.sq.post_batch([MwRequest::LocalInv { window: bound, id: 9 }]).unwrap();
    let done = owner_done(&mut b);
    assert_eq!((done.id, done.status, done.op), (9, WcStatus::Success, WcOpcode::LocalInv));
    done.value.into_unbound().unwrap().destroy().unwrap();
}
