// A fixed window of requests posted again and again, as a bandwidth tool or an RPC layer's
// request slots do: `a` sends 8 messages as one prepared chain (checked and built once,
// posted whole with one provider call, handed back once), into 8 prepared receives on `b`
// (built once, each handed back with the bytes that arrived in it, to post again).
use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType};
use rdma_verbs::{QueuePair, SendWr};

const N: usize = 8;
const LEN: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    let (mut cq_a, mut cq_b) = (CompletionQueue::new(&ctx, 64)?, CompletionQueue::new(&ctx, 64)?);
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).max_send_wr(N as u32).max_recv_wr(1).build()?;
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).max_send_wr(1).max_recv_wr(N as u32).build()?;
    let (info_a, info_b) = (a.local_info(1)?, b.local_info(1)?);
    a.connect(&InitAttr::default(), &info_b)?;
    b.connect(&InitAttr::default(), &info_a)?;

    let mut chunks = pd.register(AlignedBuf::new(2 * N * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
    let dsts = chunks.split_off(N);
    // Each request is checked against its QP (protection domain, SGE limits) once, here.
    let mut sq = a.send_chain_queue::<Chunk>()?;
    let mut rq = b.prepared_recv_queue::<Chunk>()?;
    let wrs = chunks.into_iter().enumerate().map(|(i, c)| SendWr::send(c, 0..LEN).id(i as u64));
    let mut chain = sq.prepare_chain(wrs)?;
    let mut recvs = Vec::new();
    for (i, c) in dsts.into_iter().enumerate() {
        recvs.push(rq.prepare(c, 0..LEN, i as u64)?);
    }

    for round in 0..3u8 {
        for i in 0..N {
            let message = chain.get_mut(i).ok_or("a part of the chain")?;
            message.bytes_mut()[..LEN].fill(round * 16 + i as u8);
        }
        rq.post_batch(recvs.drain(..))?; // one provider call for the 8 receives
        sq.post(chain)?; // and one for the 8 SENDs

        // Each receive comes back with what arrived in it (in posting order).
        while recvs.len() < N {
            if let Some(mut wc) = cq_b.poll_one()? {
                let done = rq.complete(&mut wc)?.result()?; // a failure names the receive
                assert_eq!(done.value.buf()[..LEN], [round * 16 + done.id as u8; LEN]);
                recvs.push(done.value);
            }
        }
        // The chain comes back once, with the completion of its last SEND.
        chain = loop {
            if let Some(mut wc) = cq_a.poll_one()? {
                let mut back = None;
                sq.complete(&mut wc, |done| back = Some(done))?;
                if let Some(done) = back {
                    break done.result()?.value;
                }
            }
        };
    }
    Ok(())
}
