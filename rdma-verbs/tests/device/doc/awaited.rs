use rdma_verbs::{
    AccessFlags, AlignedBuf, AsyncCq, AsyncRecvQueue, AsyncSendQueue, Chunk, CompletionQueue, Context, InitAttr,
    ProtectionDomain, QpType, QueuePair, SendWr,
};

fn main() -> rdma_verbs::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().expect("a tokio runtime");
    rt.block_on(async {
        let ctx = Context::open(None)?; // the first device
        let pd = ProtectionDomain::new(&ctx)?;
        // Each side of the QP completes on a channel CQ of its own.
        let scq = CompletionQueue::builder(&ctx, 128).with_channel().build()?;
        let rcq = CompletionQueue::builder(&ctx, 128).with_channel().build()?;
        let qp = QueuePair::builder(&pd, QpType::Rc, &scq, &rcq).build()?;
        qp.connect(&InitAttr::default(), &qp.local_info(1)?)?; // it talks to itself
        let mut sq = AsyncSendQueue::new(qp.send_queue::<Chunk>()?, AsyncCq::tokio(scq)?)?;
        let mut rq = AsyncRecvQueue::new(qp.recv_queue::<Chunk>()?, AsyncCq::tokio(rcq)?)?;

        let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
        let (mut src, dst) = (bufs.remove(0), bufs.remove(0));
        src[..5].copy_from_slice(b"hello");
        // Posting returns at once, with a ticket for each request.
        let received = rq.post(dst, 0..4096, 1)?;
        let sent = sq.post(SendWr::send(src, 0..5).id(2))?;

        // Each await hands its request back: the buffer, your id, how it ended.
        let got = rq.wait(received).await?.result()?;
        assert_eq!((got.id, &got.value[..5]), (1, &b"hello"[..]));
        let src = sq.wait(sent).await?.result()?.value;
        drop((src, got));
        Ok(())
    })
}
