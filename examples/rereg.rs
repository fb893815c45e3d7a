//! `rereg`: a memory region moved to a new buffer with `MemoryRegion::rereg_buffer`
//! (`ibv_rereg_mr`), and a peer's RDMA READ that then reads the new buffer.
//!
//! B registers a buffer holding "old" bytes with remote read, and A reads it. B then
//! re-registers the region over a second buffer holding "new" bytes: the old buffer comes
//! back with its contents, and A's READ through the region's new descriptor returns the
//! new bytes. A device without re-registration refuses with `Error::NotSupported` naming
//! `ibv_rereg_mr` (rxe with Debian 12's rdma-core 44, whose provider has no `rereg_mr`, on
//! Linux 6.1 and 6.12 alike); the region then comes back unchanged, the
//! example says so, checks that A still reads the old bytes under the old rkey, and
//! succeeds: the device lacks the feature, nothing failed.
//!
//! ```text
//! scripts/rxe cargo run --example rereg
//! ```
//!
//! Two RC QPs on one device (`RDMA_DEVICE`, else the first), connected to each other. One
//! line per step; the exit code is 0 only when every check passed.

#[path = "common/area.rs"]
mod area;
use area::{chunks, ensure, pattern, poll_one, AnyError};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Error, InitAttr, Local, ProtectionDomain, QpAccess, QpType,
    QueuePair, RemoteMr, SendQueue, SendWr, WcStatus,
};

const LEN: usize = 4096;

/// A's RDMA READ of all of `remote` into `dst`: the bytes.
fn read(
    sq: &mut SendQueue<Chunk>,
    cq: &mut CompletionQueue,
    dst: Chunk,
    remote: RemoteMr,
) -> Result<Vec<u8>, AnyError> {
    sq.post(SendWr::read(dst, 0..LEN, remote))?;
    let mut got = None;
    sq.complete(&mut poll_one(cq)?, |d| got = Some((d.status, d.value[..LEN].to_vec())))?;
    match got {
        Some((WcStatus::Success, bytes)) => Ok(bytes),
        other => Err(format!("A's read: {:?}", other.map(|g| g.0)).into()),
    }
}

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let (mut cq_a, cq_b) = (CompletionQueue::new(&ctx, 16)?, CompletionQueue::new(&ctx, 16)?);
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).max_send_wr(4).max_recv_wr(4).build()?;
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).max_send_wr(4).max_recv_wr(4).build()?;
    let init = InitAttr { access: QpAccess::REMOTE_READ, ..InitAttr::default() };
    a.connect(&init, &b.local_info(1)?)?;
    b.connect(&init, &a.local_info(1)?)?;
    let mut sq = a.send_queue::<Chunk>()?;
    let mut dst = chunks(&pd, 3, LEN)?;

    let (old_bytes, new_bytes) = (pattern(0x11, LEN), pattern(0xee, LEN));
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let mut old_buf = AlignedBuf::new(LEN)?;
    old_buf.copy_from_slice(&old_bytes);
    let region = pd.register(old_buf, access)?;
    let old = region.remote()?;
    ensure(read(&mut sq, &mut cq_a, dst.pop().unwrap(), old)? == old_bytes, "A read other bytes than the old ones")?;
    println!("before rereg: A reads the old buffer through rkey {:#x}", old.rkey);

    let mut new_buf = AlignedBuf::new(LEN)?;
    new_buf.copy_from_slice(&new_bytes);
    match region.rereg_buffer::<AlignedBuf, Local>(new_buf, access) {
        Ok((region, old_buf)) => {
            ensure(old_buf[..] == old_bytes[..], "the old buffer came back changed")?;
            let new = region.remote()?;
            let got = read(&mut sq, &mut cq_a, dst.pop().unwrap(), new)?;
            ensure(got == new_bytes, "A read other bytes than the new buffer's")?;
            println!(
                "rereg: the region now covers the new buffer (rkey {:#x}), and A's read returns its bytes",
                new.rkey
            );
        }
        Err(e) => {
            let Error::NotSupported { .. } = e.error else { return Err(e.error.into()) };
            println!("rereg: not supported by this device: {}", e.error);
            let region = e.region.ok_or("the region did not come back")?;
            ensure(region.rkey() == old.rkey, "the region's rkey changed")?;
            let got = read(&mut sq, &mut cq_a, dst.pop().unwrap(), old)?;
            ensure(got == old_bytes, "A read other bytes than the old ones")?;
            println!("rereg refused: the region came back unchanged and A still reads the old buffer");
        }
    }
    Ok(())
}
