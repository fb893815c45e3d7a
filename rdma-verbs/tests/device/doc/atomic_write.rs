// RDMA ATOMIC WRITE: 8 bytes stored at the peer at once, never seen half written. It is
// posted through the extended send API only, so the QP asks for the send op when it is
// built; a device without it (rxe before Linux 6.2) refuses that before C with a typed
// NotSupported, and a program falls back (here: it says so and stops). An RC QP connected
// to itself plays both sides.
use std::error::Error;

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, Error as VerbsError, InitAttr, ProtectionDomain,
    QpAccess, QpType, QueuePair, SendOps, SendWr, WorkCompletion,
};

fn main() -> Result<(), Box<dyn Error>> {
    let ctx = Context::open(None)?; // the first device
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::new(&ctx, 16)?;
    let built = QueuePair::builder(&pd, QpType::Rc, &cq, &cq)
        .max_send_wr(4)
        .max_recv_wr(4)
        .extended_send_ops(SendOps::ATOMIC_WRITE | SendOps::RDMA_WRITE)
        .build();
    let qp = match built {
        Ok(qp) => qp,
        Err(e @ VerbsError::NotSupported { .. }) => {
            // Names the capability (IB_UVERBS_DEVICE_ATOMIC_WRITE): use a lock, or a
            // compare-and-swap, instead.
            println!("no RDMA ATOMIC WRITE here: {e}");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    // The target must be writable by peers (REMOTE_WRITE, as for an RDMA WRITE).
    let init = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
    qp.connect(&init, &qp.local_info(1)?)?; // to itself
    let target =
        pd.register_remote_writable(AlignedBuf::new(64)?, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
    let remote = target.remote()?; // what a peer would get
    let mut sq = qp.send_queue::<Chunk>()?;
    let mut word = pd.register(AlignedBuf::new(64)?, AccessFlags::LOCAL_WRITE)?.into_chunks(64)?.remove(0);
    word[..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
    // 8 bytes of `word` from offset 0, at an 8-byte aligned address of the target.
    sq.post(SendWr::atomic_write(word, 0, remote.slice(8..16)?).id(1))?;
    let mut wcs = [WorkCompletion::EMPTY; 1];
    while cq.poll(&mut wcs)?.is_empty() {}
    let mut back = None;
    sq.complete(&mut wcs[0], |done| back = Some(done.result()))?;
    back.ok_or("the completion hands the buffer back")??;
    let mut got = [0u8; 8];
    target.read_at(8, &mut got)?;
    assert_eq!(u64::from_le_bytes(got), 0x1122_3344_5566_7788);
    println!("8 bytes stored at once");
    Ok(())
}
