use rdma_verbs::{
    AccessFlags, AlignedBuf, AsyncCq, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair,
    SendWr, WorkCompletion,
};

fn main() -> rdma_verbs::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("a tokio runtime");
    rt.block_on(async {
        let ctx = Context::open(None)?; // the first device
        let pd = ProtectionDomain::new(&ctx)?;
        // Awaiting needs a completion channel: its descriptor is what the reactor watches.
        let cq = CompletionQueue::builder(&ctx, 256).with_channel().build()?;
        let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
        qp.connect(&InitAttr::default(), &qp.local_info(1)?)?; // it talks to itself
        let mut cq = AsyncCq::tokio(cq)?; // inside the runtime

        let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
        let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
        src[..5].copy_from_slice(b"hello");
        let (mut rq, mut sq) = (qp.recv_queue::<Chunk>()?, qp.send_queue::<Chunk>()?);
        rq.post(dst, 0..4096, 1)?;
        sq.post(SendWr::send(src, 0..5))?;

        let mut wcs = [WorkCompletion::EMPTY; 4];
        let (mut got, mut sent) = (None, None);
        while got.is_none() || sent.is_none() {
            // Polls first; parks the task on the channel only when the CQ is empty.
            for wc in cq.completions(&mut wcs).await? {
                if wc.opcode().is_recv() {
                    got = Some(rq.complete(wc)?.result()?);
                } else {
                    sq.complete(wc, |done| sent = Some(done.result()))?;
                }
            }
        }
        // A failure names the operation, your id and the QP (`Done::result`).
        let (got, _src) = (got.unwrap(), sent.unwrap()?.value);
        assert_eq!(&got.value[..5], b"hello");
        Ok(())
    })
}
