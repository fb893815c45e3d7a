use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType};
use rdma_verbs::{QueuePair, SendWr, WorkCompletion};

fn main() -> rdma_verbs::Result<()> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    // Room for every completion the QP's queues can have pending: 128 sends + 128
    // receives by default (building the QP checks it).
    let mut cq = CompletionQueue::new(&ctx, 256)?;
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
    // Connected to what the peer's local_info says (sent by a Handshake, or rdma_cm's
    // CmId instead); here it talks to itself.
    qp.connect(&InitAttr::default(), &qp.local_info(1)?)?;

    // Register memory once and cut it into chunks: the currency of the safe data path.
    let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
    let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
    src[..5].copy_from_slice(b"hello");
    let (mut rq, mut sq) = (qp.recv_queue::<Chunk>()?, qp.send_queue::<Chunk>()?);
    rq.post(dst, 0..4096, 1)?; // the queue owns `dst` now
    sq.post(SendWr::send(src, 0..5).id(2))?;

    let mut wcs = [WorkCompletion::EMPTY; 4];
    let (mut got, mut sent) = (None, None);
    while got.is_none() || sent.is_none() {
        for wc in cq.poll(&mut wcs)?.iter_mut() {
            // Each buffer comes back with its completion (a `Done`); `result()` makes a
            // failure an error that names the operation, your id and the QP.
            if wc.opcode().is_recv() {
                got = Some(rq.complete(wc)?.result()?);
            } else {
                sq.complete(wc, |done| sent = Some(done.result()))?;
            }
        }
    }
    let (got, _src) = (got.unwrap(), sent.unwrap()?.value);
    assert_eq!(&got.value[..5], b"hello");
    Ok(())
}
