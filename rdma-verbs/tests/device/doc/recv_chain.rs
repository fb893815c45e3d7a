// A fixed window of receives posted again and again, as a bandwidth tool's receiver does:
// `b` prepares 8 receives as one chain (checked and built once, posted whole with one
// provider call), `a` fills them with a chain of 8 SENDs; the receive chain comes back
// once, after its last receive, with the bytes and the length that arrived in each.
use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType};
use rdma_verbs::{QueuePair, SendWr, WorkCompletion};

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
    let mut sq = a.send_chain_queue::<Chunk>()?;
    let mut rq = b.recv_chain_queue::<Chunk>()?;
    // Each receive is checked against the QP (protection domain, SGE limit) once, here.
    let mut recvs = Some(rq.prepare_chain(dsts.into_iter().enumerate().map(|(i, c)| (c, 0..LEN, i as u64)))?);
    let wrs = chunks.into_iter().enumerate().map(|(i, c)| SendWr::send(c, 0..LEN - i).id(i as u64));
    let mut sends = sq.prepare_chain(wrs)?;

    let mut wcs = [WorkCompletion::EMPTY; 16];
    for round in 0..3u8 {
        for i in 0..N {
            sends.get_mut(i).ok_or("a part of the chain")?.bytes_mut()[..LEN].fill(round * 16 + i as u8);
        }
        rq.post(recvs.take().ok_or("the receive chain is back")?)?; // one provider call for 8
        sq.post(sends)?; // and one for the 8 SENDs

        // Each poll's completions in one call; the chain comes back once, after its last.
        let mut back = None;
        while back.is_none() {
            let polled = cq_b.poll(&mut wcs)?;
            rq.complete_all(polled, |done| back = Some(done))?;
        }
        let chain = back.ok_or("the receive chain")?.result()?.value; // a failure names it
        for (i, r) in chain.iter().enumerate() {
            assert_eq!(r.byte_len() as usize, LEN - i); // what arrived in receive i
            assert_eq!(r.buf()[..LEN - i], vec![round * 16 + i as u8; LEN - i][..]);
        }
        recvs = Some(chain);
        sends = loop {
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
