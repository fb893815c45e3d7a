// Waiting for completions without spinning: a CQ with a completion channel, armed before
// it is drained, so that a completion landing between the last poll and the sleep still
// wakes the sleeper. An RC QP connected to itself sends four messages to itself.
use std::time::Duration;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair, SendWr,
    WorkCompletion,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::builder(&ctx, 256).with_channel().build()?;
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build()?;
    qp.connect(&InitAttr::default(), &qp.local_info(1)?)?; // to itself

    let mut bufs: Vec<Chunk> = pd.register(AlignedBuf::new(8 * 64)?, AccessFlags::LOCAL_WRITE)?.into_chunks(64)?;
    let mut rq = qp.recv_queue::<Chunk>()?;
    let mut sq = qp.send_queue::<Chunk>()?;
    for (i, buf) in bufs.drain(..4).enumerate() {
        rq.post(buf, 0..64, i as u64)?;
    }
    for (i, mut buf) in bufs.drain(..).enumerate() {
        buf[0] = i as u8;
        sq.post(SendWr::send(buf, 0..1))?;
    }

    let mut wcs = [WorkCompletion::EMPTY; 32];
    let (mut received, mut sent) = (Vec::new(), Vec::new());
    loop {
        cq.arm(false)?; // 1. arm first,
        loop {
            // 2. then drain what is already there,
            let done = cq.poll(&mut wcs)?;
            if done.is_empty() {
                break;
            }
            for wc in done {
                if wc.opcode().is_recv() {
                    received.push(rq.complete(wc)?.result()?.value[0]);
                } else {
                    sq.complete(wc, |done| sent.push(done.result()))?;
                }
            }
        }
        if received.len() == 4 && sent.len() == 4 {
            break;
        }
        // 3. then sleep: a completion that came after step 1 has raised the event already.
        cq.wait(Some(Duration::from_secs(10)))?;
    }
    for done in sent {
        done?; // a failure names the operation, your id and the QP
    }
    assert_eq!(received, [0, 1, 2, 3], "every message arrived, in order");
    Ok(())
}
