use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair, SendWr,
    WorkCompletion,
};

fn main() -> rdma_verbs::Result<()> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    // Room for every completion the QP's queues can have pending: 128 sends + 128 receives
    // by default (building the QP checks it).
    let mut cq = CompletionQueue::new(&ctx, 256)?;
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
    // Connect it: QueuePair::connect with the peer's QueuePair::local_info (exchanged by
    // the endpoint handshake or rdma_cm), sending from the PSN local_info advertised.
    // Here it talks to itself.
    let me = qp.local_info(1)?;
    qp.connect(&InitAttr::default(), &me)?;

    // Register memory once and cut it into chunks: the currency of the safe data path.
    let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
    let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
    src[..5].copy_from_slice(b"hello");

    let mut rq = qp.recv_queue::<Chunk>()?;
    let mut sq = qp.send_queue::<Chunk>()?;
    rq.post(dst, 0..4096, 1)?; // the queue owns `dst` now
    sq.post(SendWr::send(src, 0..5))?;

    let mut wcs = [WorkCompletion::EMPTY; 4];
    let (mut got, mut sent) = (None, None);
    while got.is_none() || sent.is_none() {
        for wc in cq.poll(&mut wcs)?.iter_mut() {
            if wc.opcode().is_recv() {
                got = Some(rq.complete(wc)?.result()?); // `dst` comes back, with what arrived
            } else {
                sq.complete(wc, |done| sent = Some(done.result()))?; // `src` comes back
            }
        }
    }
    // A failure names the operation, your id and the QP (`Done::result`).
    let (got, _src) = (got.unwrap(), sent.unwrap()?.buf);
    assert_eq!(&got.buf[..5], b"hello");
    Ok(())
}
