// Memory windows: grant a peer part of a region, and take it back. A type 2 window is
// bound through the QP's one send queue, an RDMA WRITE lands through the window's rkey,
// and a local invalidate ends the binding (the device refuses the rkey from then on). An
// RC QP connected to itself plays both sides.
use std::error::Error;
use std::sync::Arc;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, MwBind, MwDone, MwRequest, MwSendQueue, MwType,
    ProtectionDomain, QpAccess, QpType, QueuePair, SendWr, WorkCompletion,
};

fn main() -> Result<(), Box<dyn Error>> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::new(&ctx, 256)?;
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
    let init = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
    qp.connect(&init, &qp.local_info(1)?)?; // to itself
    let mut sq = qp.mw_send_queue::<Chunk>()?; // the QP's one send queue

    // MW_BIND makes the region remote-writable (copies and atomics, never slices);
    // LOCAL_WRITE lets a window grant remote write.
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
    let region = Arc::new(pd.register_remote_writable(AlignedBuf::new(4096)?, access)?);
    let window = pd.alloc_mw(MwType::Type2)?;
    sq.bind_mw(MwBind::new(window, &region, 1024..2048, AccessFlags::REMOTE_WRITE).id(1))?;
    let bound = next(&mut cq, &mut sq)?.into_bound().ok_or("a bind hands back the bound window")?;

    // What a peer gets (send it `bound.key().remote().to_bytes()`); here the QP writes to
    // itself through the window.
    let remote = bound.key().remote();
    let mut src = pd.register(AlignedBuf::new(64)?, AccessFlags::LOCAL_WRITE)?.into_chunks(64)?.remove(0);
    src[..5].copy_from_slice(b"hello");
    sq.post(MwRequest::Wr(SendWr::write(src, 0..5, remote).id(2)))?;
    next(&mut cq, &mut sq)?;
    let mut got = [0u8; 5];
    region.read_at(1024, &mut got)?;
    assert_eq!(&got, b"hello");

    // Take it back; the window comes back unbound and lets the region go.
    sq.invalidate_mw(bound, 3)?;
    let window = next(&mut cq, &mut sq)?.into_unbound().ok_or("an invalidation hands back the window")?;
    window.destroy()?; // ibv_dealloc_mw (dropping it does the same)
    assert_eq!(Arc::strong_count(&region), 1);
    Ok(())
}

/// What the queue's next finished request hands back, or its failure.
fn next(cq: &mut CompletionQueue, sq: &mut MwSendQueue<Chunk>) -> Result<MwDone<Chunk>, Box<dyn Error>> {
    let mut wcs = [WorkCompletion::EMPTY; 1];
    loop {
        if let Some(wc) = cq.poll(&mut wcs)?.first_mut() {
            let mut done = None;
            sq.complete(wc, |d| done = Some(d))?;
            return Ok(done.ok_or("the completion finished a request")?.result()?.value);
        }
    }
}
