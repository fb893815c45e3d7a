//! `memory_window`: a memory window gives a peer RDMA access to part of a region, and
//! takes it back.
//!
//! B registers 4 KiB with `MW_BIND` only (no remote right of its own), binds a type 2
//! window over bytes 1024..2048 through its send queue, and sends the window's descriptor
//! to A (here: its wire form, as between two hosts). A WRITEs 200 bytes through the
//! window, then READs them back; B checks that they arrived where the window put them and
//! that nothing else changed. B then invalidates the window: A's next WRITE with the same
//! rkey is refused by the device (remote access error) and no byte changes.
//!
//! ```text
//! scripts/rxe cargo run --example memory_window
//! ```
//!
//! A and B are two RC QPs on one device (`RDMA_DEVICE`, else the first), connected to
//! each other. One line per step; the exit code is 0 only when every check passed.

use std::sync::Arc;

#[path = "common/area.rs"]
mod area;
use area::{chunks, ensure, pattern, poll_one, AnyError};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, InitAttr, MwBind, MwType, ProtectionDomain, QpAccess, QpType,
    QueuePair, RemoteMr, SendWr, WcStatus,
};

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let (mut cq_a, mut cq_b) = (CompletionQueue::new(&ctx, 32)?, CompletionQueue::new(&ctx, 32)?);
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).max_send_wr(8).max_recv_wr(8).build()?;
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).max_send_wr(8).max_recv_wr(8).build()?;
    // The QPs allow remote reads and writes: the window decides what A may touch.
    let init = InitAttr { access: QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ, ..InitAttr::default() };
    a.connect(&init, &b.local_info(1)?)?;
    b.connect(&init, &a.local_info(1)?)?;
    let mut peer = a.send_queue()?;
    // Windows are bound and invalidated through the owner's send queue.
    let mut owner = b.mw_send_queue::<Chunk>()?;

    let mut region =
        pd.register_remote_writable(AlignedBuf::new(4096)?, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    let before = pattern(0x5a, 4096);
    region.write_at(0, &before)?;
    // A bound window holds its region: shared.
    let region = Arc::new(region);

    // Bind: the window covers bytes 1024..2048 with remote write and read.
    let window = pd.alloc_mw(MwType::Type2)?;
    let access = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    owner.bind_mw(MwBind::new(window, &region, 1024..2048, access).id(1))?;
    // Its completion hands the window back, bound (a failed bind: the error says why).
    let mut bind = None;
    owner.complete(&mut poll_one(&mut cq_b)?, |done| bind = Some(done.result()))?;
    let bound = bind.ok_or("no completion for the bind")??.value.into_bound().ok_or("no bound window")?;
    // What A is sent: the window's descriptor, through its wire form as between two hosts.
    let remote = RemoteMr::from_bytes(&bound.key().remote().to_bytes())?;
    ensure(remote.addr == region.addr() + 1024 && remote.len == 1024, format!("the window is {remote:?}"))?;
    println!(
        "bind: a type 2 window over bytes 1024..2048, rkey {:#x} (the region grants no remote access itself)",
        remote.rkey
    );

    // A writes 200 bytes at offset 100 of the window.
    let data = pattern(0xa7, 200);
    let mut bufs = chunks(&pd, 3, 4096)?;
    let mut src = bufs.pop().unwrap();
    src[..200].copy_from_slice(&data);
    peer.post(SendWr::write(src, 0..200, remote.slice(100..300)?).id(2))?;
    let mut status = None;
    peer.complete(&mut poll_one(&mut cq_a)?, |done| status = Some(done.status))?;
    ensure(status == Some(WcStatus::Success), format!("A's write through the window: {status:?}"))?;
    let mut after = vec![0u8; 4096];
    region.read_at(0, &mut after)?;
    ensure(after[1124..1324] == data[..], "the written bytes are not at offset 1124 of the region")?;
    ensure(after[..1124] == before[..1124] && after[1324..] == before[1324..], "bytes outside the write changed")?;
    println!("write through the window: 200 bytes arrived at offset 1124 of the region, no other byte changed");

    // A reads them back through the window.
    peer.post(SendWr::read(bufs.pop().unwrap(), 0..200, remote.slice(100..300)?).id(3))?;
    let mut read = None;
    peer.complete(&mut poll_one(&mut cq_a)?, |done| read = Some((done.status, done.value[..200].to_vec())))?;
    ensure(read == Some((WcStatus::Success, data.clone())), format!("A's read through the window: {read:?}"))?;
    println!("read through the window: the same 200 bytes came back");

    // B invalidates the window: its rkey opens nothing any more.
    owner.invalidate_mw(bound, 4)?;
    let mut invalidation = None;
    owner.complete(&mut poll_one(&mut cq_b)?, |done| invalidation = Some(done.result()))?;
    let window = invalidation.ok_or("no completion for the invalidation")??.value.into_unbound().ok_or("no window")?;
    let mut src = bufs.pop().unwrap();
    src[..64].fill(0xff);
    peer.post(SendWr::write(src, 0..64, remote).id(5))?;
    let mut status = None;
    peer.complete(&mut poll_one(&mut cq_a)?, |done| status = Some(done.status))?;
    ensure(status == Some(WcStatus::RemAccessErr), format!("A's write after the invalidation: {status:?}"))?;
    let mut last = vec![0u8; 4096];
    region.read_at(0, &mut last)?;
    ensure(last == after, "the refused write changed bytes")?;
    println!("after invalidation: A's write with the old rkey is refused (remote access error), no byte changed");

    window.destroy()?;
    Ok(())
}
