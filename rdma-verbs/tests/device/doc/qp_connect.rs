// Two RC queue pairs connected to each other as two programs would connect them: each
// sends its peer what `local_info` returns (over TCP, in a file; here, in memory) and
// connects to what it got back. Then `a` writes into `b`'s memory with RDMA WRITE.
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpAccess, QpType, QueuePair,
    RemoteQpInfo, SendWr,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    // Room for every completion both QPs can have pending: 2 x (64 sends + 64 receives).
    let mut cq = CompletionQueue::new(&ctx, 256)?;
    let a = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(64).max_recv_wr(64).build()?;
    // A QP sends from a random first PSN unless the builder fixes one (tests, tools that
    // must match a peer); local_info advertises it and connect sends from it.
    let b = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(64).max_recv_wr(64).psn(0x1234).build()?;
    assert_eq!(b.local_info(1)?.psn, 0x1234);

    // The exchange: 26 bytes each way (port 1).
    let (from_a, from_b) = (a.local_info(1)?.to_bytes(), b.local_info(1)?.to_bytes());
    a.connect(&InitAttr::default(), &RemoteQpInfo::from_bytes(&from_b)?)?;
    // `b` lets its peer write (and read) its memory; the region has to allow it too.
    let init = InitAttr { access: QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ, ..InitAttr::default() };
    b.connect(&init, &RemoteQpInfo::from_bytes(&from_a)?)?;

    // `b` registers a region its peer may write and sends it `target.remote()` (address,
    // length, rkey) the same way.
    let target = pd.register_remote_writable(AlignedBuf::new(4096)?, AccessFlags::REMOTE_WRITE)?;
    let remote = target.remote()?;

    // `a` writes 5 bytes of a registered chunk there.
    let mut src: Chunk = pd.register(AlignedBuf::new(4096)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?.remove(0);
    src[..5].copy_from_slice(b"hello");
    let mut sq = a.send_queue::<Chunk>()?;
    sq.post(SendWr::write(src, 0..5, remote))?;
    let mut wc = loop {
        if let Some(wc) = cq.poll_one()? {
            break wc;
        }
    };
    // `src` comes back; a failure is an error naming the operation (RDMA WRITE), your id
    // and the QP.
    let mut written = None;
    sq.complete(&mut wc, |done| written = Some(done.result()))?;
    let _src = written.ok_or("the WRITE's completion")??.value;

    // An RC write completes once the peer acknowledged it: the bytes are in `b`'s memory.
    let mut landed = [0u8; 5];
    target.read_at(0, &mut landed)?;
    assert_eq!(&landed, b"hello");
    Ok(())
}
