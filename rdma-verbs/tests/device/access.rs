//! Access control on a real device: a region grants exactly the remote rights it was
//! registered with, within exactly its bytes, to exactly its protection domain, for as
//! long as it is registered. Each refused request completes with `REM_ACCESS_ERR` on the
//! requester and leaves every target byte as it was (and, for a READ, the requester's
//! buffer too: nothing leaks). Bound: each completion, refusal or not, arrives within
//! `poll_one`'s 10 s (a refusal is a NAK from the responder, not a timeout).
//!
//! The QPs here allow every remote operation (`QpAccess` all set), so the region alone
//! decides. A refused request moves both QPs to the error state, so each attempt gets a
//! fresh pair. The remote address and key are built by hand, as a buggy or hostile peer
//! would send them: `RemoteMr` is plain data, and the safe slicing (`RemoteMr::slice`)
//! would refuse these out-of-range requests before the device ever saw them.
//!
//! What rxe (Linux 6.1) does not enforce, and so is not tested here: the bounds of a type 1
//! memory window (it checks the window's rkey but lets writes through anywhere in the
//! underlying region; see rdma-sys/tests/device/mw.rs). The safe crate's windows are
//! tested in mw.rs.

use rdma_verbs::SendWr;
use rdma_verbs::{
    AccessFlags, Chunk, Error, MemoryRegion, ProtectionDomain, QpAccess, Refused, RemoteMr, Verb, WcStatus,
};
use rdma_verbs::{AccessMode, RegisterableBuffer, RemoteWritable};

use crate::datapath::{chunks, poll_one, rc_pair, Side};
use crate::LeakCheck;

const PAGE: usize = 4096;
/// Everything a QP can allow: the region is the only gate.
const ALL_QP: QpAccess = QpAccess::REMOTE_WRITE.union(QpAccess::REMOTE_READ).union(QpAccess::REMOTE_ATOMIC);
/// Everything a region can grant (besides windows).
const ALL_MR: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);
/// The 8-byte word at the start of the region, before any atomic.
const WORD: u64 = 0x0102_0304_0506_0708;

/// One remote operation, as the requester posts it.
#[derive(Debug, Clone, Copy)]
enum Op {
    Write,
    Read,
    Cas,
    Faa,
}

/// Three pages: the middle one is the target region, the outer two guard its edges. Every
/// byte is even and every byte of the requester's source is odd, so a single byte that
/// arrived cannot go unnoticed.
fn arena() -> Vec<u8> {
    let mut a: Vec<u8> = (0..3 * PAGE).map(|i| (i as u8).wrapping_mul(7).wrapping_add(2) & 0xfe).collect();
    a[PAGE..PAGE + 8].copy_from_slice(&WORD.to_ne_bytes().map(|b| b & 0xfe));
    a
}

fn source_byte(j: usize) -> u8 {
    (j as u8 ^ 0xa5) | 1
}

/// The target word as `arena` leaves it (host order, every byte even).
fn word() -> u64 {
    u64::from_ne_bytes(arena()[PAGE..PAGE + 8].try_into().unwrap())
}

/// What one attempt did: the completion status and the requester's buffer afterwards.
struct Attempt {
    status: WcStatus,
    local: Vec<u8>,
}

/// Posts `op` from `a` towards `remote` out of a fresh source buffer filled with odd bytes,
/// and waits (bounded) for its completion.
fn run(pd: &ProtectionDomain, a: &mut Side<Chunk>, op: Op, remote: RemoteMr) -> Attempt {
    let mut src = chunks(pd, 1, 2 * PAGE, AccessFlags::LOCAL_WRITE).pop().unwrap();
    for (j, b) in src.iter_mut().enumerate() {
        *b = source_byte(j);
    }
    let len = remote.len as usize;
    let wr = match op {
        Op::Write => SendWr::write(src, 0..len, remote),
        Op::Read => SendWr::read(src, 0..len, remote),
        Op::Cas => SendWr::compare_swap(src, 0, remote, word(), 0x1111),
        Op::Faa => SendWr::fetch_add(src, 0, remote, 1),
    };
    a.sq.post(wr.id(77)).unwrap();
    let mut wc = poll_one(&mut a.cq);
    let mut done = None;
    a.sq.complete(&mut wc, |d| done = Some(d)).unwrap();
    let done = done.expect("the completion hands back its request");
    assert_eq!(done.id, 77);
    eprintln!("{op:?} to {:#x}+{} rkey {:#x}: {:?}", remote.addr, remote.len, remote.rkey, done.status);
    let (status, qp_num) = (done.status, done.qp_num);
    assert_eq!(qp_num, a.sq.qp_num());
    // A failure turns into an error naming the operation, our id, the QP, the status and
    // the usual cause, and the buffer still comes back with it.
    let buf = match done.result() {
        Ok(d) => d.value,
        Err(refused) => {
            let text = refused.error.to_string();
            let name = match op {
                Op::Write => "RDMA WRITE",
                Op::Read => "RDMA READ",
                Op::Cas => "atomic compare-and-swap",
                Op::Faa => "atomic fetch-and-add",
            };
            let head = format!("{name} id 77 on QP {qp_num:#x} failed: {status}");
            assert!(text.starts_with(&head), "{text:?} does not start with {head:?}");
            if status == WcStatus::RemAccessErr {
                assert!(text.contains("hint: the peer refused the memory access"), "{text}");
            }
            refused.into_value()
        }
    };
    Attempt { status, local: buf[..len.max(8)].to_vec() }
}

/// Where the request aims, relative to the region.
type Aim = fn(RemoteMr) -> RemoteMr;

/// The region's address, length and rkey, as a peer that got hold of the rkey would aim
/// them. Built by hand: `MemoryRegion::remote` hands out no descriptor of a region that
/// grants no remote right, and these tests aim at such regions on purpose.
fn raw_descriptor<B: RegisterableBuffer, M: AccessMode>(mr: &MemoryRegion<B, M>) -> RemoteMr {
    RemoteMr { addr: mr.addr(), len: mr.len() as u64, rkey: mr.rkey() }
}

/// A fresh RC pair (every remote operation allowed on the QPs); the middle page of `bytes`
/// registered on B's side with `access` (in B's PD, or in another PD of the same device
/// when `other_pd`); one request of `op` from A aimed by `aim`. The region is deregistered
/// before this returns, so the caller reads `bytes` as plain memory.
fn attempt(bytes: &mut [u8], access: AccessFlags, other_pd: bool, op: Op, aim: Aim) -> Attempt {
    let (pd, mut a, b) = rc_pair::<Chunk>(ALL_QP);
    let foreign = ProtectionDomain::new(pd.context()).unwrap();
    let region_pd = if other_pd { &foreign } else { &pd };
    let (_, rest) = bytes.split_at_mut(PAGE);
    let (mid, _) = rest.split_at_mut(PAGE);
    let mr = MemoryRegion::<&mut [u8], RemoteWritable>::new(region_pd, mid, access).unwrap();
    let out = run(&pd, &mut a, op, aim(raw_descriptor(&mr)));
    drop((mr, a, b));
    out
}

fn whole(r: RemoteMr) -> RemoteMr {
    r
}

fn first_word(r: RemoteMr) -> RemoteMr {
    RemoteMr { len: 8, ..r }
}

/// Refused: `REM_ACCESS_ERR`, every byte of the arena as it was, and the requester's
/// buffer as it was (no byte of the region leaked into it).
#[track_caller]
fn assert_refused(what: &str, got: Attempt, bytes: &[u8]) {
    assert_eq!(got.status, WcStatus::RemAccessErr, "{what}: refused with a remote access error");
    let changed = bytes.iter().zip(arena()).filter(|(a, b)| **a != *b).count();
    assert_eq!(changed, 0, "{what}: {changed} target bytes changed");
    let leaked = got.local.iter().enumerate().filter(|&(j, &b)| b != source_byte(j)).count();
    assert_eq!(leaked, 0, "{what}: {leaked} bytes of the requester's buffer were overwritten");
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn remote_write_to_a_region_without_remote_write_is_refused_and_changes_no_byte() {
    let _leaks = LeakCheck::new();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    // The same region, key and address admit what was granted: a READ of all of it.
    let mut bytes = arena();
    let got = attempt(&mut bytes, access, false, Op::Read, whole);
    assert_eq!(got.status, WcStatus::Success);
    assert_eq!(&got.local[..PAGE], &arena()[PAGE..2 * PAGE], "the granted READ returned the region");

    let mut bytes = arena();
    let got = attempt(&mut bytes, access, false, Op::Write, whole);
    assert_refused("WRITE without REMOTE_WRITE", got, &bytes);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn remote_read_of_a_region_without_remote_read_is_refused_and_reveals_no_byte() {
    let _leaks = LeakCheck::new();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    let mut bytes = arena();
    let got = attempt(&mut bytes, access, false, Op::Write, whole);
    assert_eq!(got.status, WcStatus::Success, "the granted WRITE went through");
    assert!(bytes[PAGE..2 * PAGE].iter().enumerate().all(|(j, &b)| b == source_byte(j)));

    let mut bytes = arena();
    let got = attempt(&mut bytes, access, false, Op::Read, whole);
    assert_refused("READ without REMOTE_READ", got, &bytes);
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn atomics_on_a_region_without_remote_atomic_are_refused_and_leave_the_word_unchanged() {
    let _leaks = LeakCheck::new();
    // With the right, a compare-and-swap changes the word and returns the old one.
    let mut bytes = arena();
    let got = attempt(&mut bytes, ALL_MR, false, Op::Cas, first_word);
    assert_eq!(got.status, WcStatus::Success);
    assert_eq!(u64::from_ne_bytes(got.local[..8].try_into().unwrap()), word());
    assert_eq!(u64::from_ne_bytes(bytes[PAGE..PAGE + 8].try_into().unwrap()), 0x1111);

    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    for op in [Op::Cas, Op::Faa] {
        let mut bytes = arena();
        let got = attempt(&mut bytes, access, false, op, first_word);
        assert_refused(&format!("{op:?} without REMOTE_ATOMIC"), got, &bytes);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_wrong_rkey_is_refused_for_write_read_and_atomics() {
    let _leaks = LeakCheck::new();
    // The nearest wrong key (the same region index on rxe, another key byte) and one far off.
    let near: Aim = |r| RemoteMr { rkey: r.rkey ^ 1, ..r };
    let far: Aim = |r| RemoteMr { rkey: !r.rkey, ..r };
    let near_word: Aim = |r| RemoteMr { rkey: r.rkey ^ 1, len: 8, ..r };
    for (what, op, aim) in [
        ("WRITE, rkey ^ 1", Op::Write, near),
        ("WRITE, !rkey", Op::Write, far),
        ("READ, rkey ^ 1", Op::Read, near),
        ("FAA, rkey ^ 1", Op::Faa, near_word),
    ] {
        let mut bytes = arena();
        let got = attempt(&mut bytes, ALL_MR, false, op, aim);
        assert_refused(what, got, &bytes);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn requests_one_byte_outside_the_region_are_refused_and_the_edges_are_exact() {
    let _leaks = LeakCheck::new();
    // All of the region, to the byte, is writable, and nothing around it changes.
    let mut bytes = arena();
    let got = attempt(&mut bytes, ALL_MR, false, Op::Write, whole);
    assert_eq!(got.status, WcStatus::Success);
    assert!(bytes[PAGE..2 * PAGE].iter().enumerate().all(|(j, &b)| b == source_byte(j)), "the region was written");
    assert_eq!(&bytes[..PAGE], &arena()[..PAGE], "the guard page before is untouched");
    assert_eq!(&bytes[2 * PAGE..], &arena()[2 * PAGE..], "the guard page after is untouched");

    let cases: [(&str, Op, Aim); 6] = [
        ("WRITE of the byte before the region", Op::Write, |r| RemoteMr { addr: r.addr - 1, len: 1, ..r }),
        ("WRITE starting one byte before", Op::Write, |r| RemoteMr { addr: r.addr - 1, len: 8, ..r }),
        ("WRITE of the byte past the end", Op::Write, |r| RemoteMr { addr: r.addr + r.len, len: 1, ..r }),
        ("WRITE running one byte past the end", Op::Write, |r| RemoteMr { addr: r.addr + r.len - 8, len: 9, ..r }),
        ("WRITE of the whole region plus one byte", Op::Write, |r| RemoteMr { len: r.len + 1, ..r }),
        ("READ running one byte past the end", Op::Read, |r| RemoteMr { addr: r.addr + r.len - 8, len: 9, ..r }),
    ];
    for (what, op, aim) in cases {
        let mut bytes = arena();
        let got = attempt(&mut bytes, ALL_MR, false, op, aim);
        assert_refused(what, got, &bytes);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_rkey_from_another_protection_domain_is_refused() {
    let _leaks = LeakCheck::new();
    // A region granting everything, on the same device, but not in the target QP's PD.
    for (what, op, aim) in
        [("WRITE", Op::Write, whole as Aim), ("READ", Op::Read, whole as Aim), ("FAA", Op::Faa, first_word as Aim)]
    {
        let mut bytes = arena();
        let got = attempt(&mut bytes, ALL_MR, true, op, aim);
        assert_refused(&format!("{what} with another PD's rkey"), got, &bytes);
    }
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn an_rkey_stops_working_when_its_region_is_deregistered() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, b) = rc_pair::<Chunk>(ALL_QP);
    let mut bytes = arena();
    let remote = {
        let (_, rest) = bytes.split_at_mut(PAGE);
        let (mid, _) = rest.split_at_mut(PAGE);
        let mr = pd.register_remote_writable(mid, ALL_MR).unwrap();
        let remote = mr.remote().unwrap();
        let first = RemoteMr { len: 64, ..remote };
        let got = run(&pd, &mut a, Op::Write, first);
        assert_eq!(got.status, WcStatus::Success, "the key works while the region is registered");
        remote
        // `mr` is dropped here: ibv_dereg_mr.
    };
    let after_first = bytes.clone();
    assert!(bytes[PAGE..PAGE + 64].iter().enumerate().all(|(j, &b)| b == source_byte(j)));
    // The same QP, the same key, the next bytes: refused now.
    let got = run(&pd, &mut a, Op::Write, RemoteMr { addr: remote.addr + 64, len: 64, ..remote });
    assert_eq!(got.status, WcStatus::RemAccessErr, "a deregistered region's rkey is refused");
    assert_eq!(bytes, after_first, "no byte changed after deregistration");
    drop((a, b));
}

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn a_region_registered_with_the_default_access_grants_no_remote_right() {
    let _leaks = LeakCheck::new();
    assert_eq!(AccessFlags::default(), AccessFlags::LOCAL_WRITE);
    for (op, aim) in [(Op::Write, whole as Aim), (Op::Read, whole as Aim), (Op::Cas, first_word as Aim)] {
        let (pd, mut a, b) = rc_pair::<Chunk>(ALL_QP);
        let mut bytes = arena();
        let got = {
            let (_, rest) = bytes.split_at_mut(PAGE);
            let (mid, _) = rest.split_at_mut(PAGE);
            // The plain, local registration: the one that hands out slices.
            let mr = pd.register_slice(mid, AccessFlags::default()).unwrap();
            assert_eq!(mr.access(), AccessFlags::LOCAL_WRITE);
            assert!(!mr.access().is_remote_writable());
            // It hands out no remote descriptor: one could never work, as the device shows.
            let e = mr.remote().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::MrRemote, .. }), "{e}");
            run(&pd, &mut a, op, aim(raw_descriptor(&mr)))
        };
        assert_refused(&format!("{op:?} on a default region"), got, &bytes);
        drop((a, b));
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_buffer_registered_in_another_protection_domain_is_refused_before_c_by_every_path() {
    let _leaks = LeakCheck::new();
    let (pd, mut a, mut b) = rc_pair::<Chunk>(ALL_QP);
    let foreign = ProtectionDomain::new(pd.context()).unwrap();
    let mut theirs = chunks(&foreign, 4, 64, AccessFlags::LOCAL_WRITE);
    // Any remote region: the request never reaches the wire.
    let remote = RemoteMr { addr: 0x1000, len: 64, rkey: 1 };
    // Refused before C by the method called, which the error names first.
    let says_other_pd = |e: &Error, method: &str| {
        assert!(matches!(e, Error::InvalidArgument { verb, .. } if verb.name() == method), "by {method}: {e:?}");
        assert!(e.to_string().starts_with(&format!("{method}: ")), "{e}");
        assert!(e.to_string().contains("another protection domain"), "{e}");
    };

    // A SEND source, one post and a batch: refused, handed back, nothing posted.
    let Refused { error, value } = a.sq.post(SendWr::send(theirs.pop().unwrap(), 0..64)).unwrap_err();
    says_other_pd(&error, "SendQueue::post");
    assert!(error.to_string().contains("refused before ibv_post_send, nothing posted"), "{error}");
    let Refused { error, value } = a.sq.post_batch([value, SendWr::send(theirs.pop().unwrap(), 0..64)]).unwrap_err();
    says_other_pd(&error, "SendQueue::post_batch");
    assert_eq!(value.len(), 2, "both requests come back");
    assert_eq!(a.sq.outstanding(), 0);
    // A receive target on the other side: a receive verb is named, never a send one.
    let Refused { error, .. } = b.rq.post(theirs.pop().unwrap(), 0..64, 1).unwrap_err();
    says_other_pd(&error, "RecvQueue::post");
    assert!(error.to_string().contains("refused before ibv_post_recv, nothing posted"), "{error}");
    assert_eq!(b.rq.outstanding(), 0);
    // And a request prepared for this QP.
    let Side { sq, qp, cq, .. } = a;
    drop(sq);
    let pq = qp.prepared_send_queue::<Chunk>().unwrap();
    let Refused { error, .. } = pq.prepare(SendWr::write(theirs.pop().unwrap(), 0..64, remote)).unwrap_err();
    says_other_pd(&error, "SendQueue::prepare");
    drop((pq, qp, cq, b));
}
