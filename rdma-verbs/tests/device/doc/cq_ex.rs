// An extended CQ: `b` receives on a CQ built with `CqBuilder::extended` and reads its
// completions with `poll_extended`, which copies each out of the provider's queue
// (ibv_start_poll / ibv_next_poll / ibv_end_poll) into an `ExtendedCompletion`. That is a
// `WorkCompletion` for the queues (`complete` takes it), plus the fields asked for.
use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, ExtendedCompletion, InitAttr, ProtectionDomain, QpType,
    QueuePair, SendWr, WcFields, WcOpcode,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq_a = CompletionQueue::new(&ctx, 128)?;
    // No extra fields: rxe has no timestamps (a device without one refuses the CQ here).
    let mut cq_b = CompletionQueue::builder(&ctx, 128).extended(WcFields::empty()).build()?;
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).max_send_wr(32).max_recv_wr(32).build()?;
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).max_send_wr(32).max_recv_wr(32).build()?;
    a.connect(&InitAttr::default(), &b.local_info(1)?)?;
    b.connect(&InitAttr::default(), &a.local_info(1)?)?;

    let mut chunks = pd.register(AlignedBuf::new(8192)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?;
    let (mut src, dst) = (chunks.remove(0), chunks.remove(0));
    src[..5].copy_from_slice(b"hello");
    let (mut sq, mut rq) = (a.send_queue::<Chunk>()?, b.recv_queue::<Chunk>()?);
    rq.post(dst, 0..4096, 7)?;
    sq.post(SendWr::send(src, 0..5).imm(0xfeed))?;

    let mut out: [ExtendedCompletion; 4] = std::array::from_fn(|_| ExtendedCompletion::EMPTY);
    let got = loop {
        if let Some(c) = cq_b.poll_extended(&mut out)?.first_mut() {
            assert_eq!(c.opcode(), WcOpcode::Recv);
            assert_eq!(c.imm_data(), Some(0xfeed));
            assert_eq!(c.qp_num(), b.qp_num());
            // Deref: the receive queue takes it as it takes a classic completion.
            break rq.complete(c)?.result()?;
        }
    };
    assert_eq!((got.id, got.byte_len), (7, 5));
    assert_eq!(&got.value[..5], b"hello");
    // The sender's CQ is a classic one.
    let mut sent = None;
    while sent.is_none() {
        if let Some(mut wc) = cq_a.poll_one()? {
            sq.complete(&mut wc, |d| sent = Some(d.result().map(|d| d.value)))?;
        }
    }
    sent.ok_or("the SEND's completion")??;
    Ok(())
}
