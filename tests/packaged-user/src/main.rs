//! What a user's first program does: open the device (`RDMA_DEVICE`, else the first),
//! register memory, connect two RC queue pairs to each other, RDMA WRITE 64 bytes from one
//! into the other's memory and check that they arrived. Exits 0 when they did.
//!
//! `packaged-user --bindings` prints which bindings the build used and touches no device.

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpAccess, QpType, QueuePair,
    SendWr,
};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bindings = if rdma_verbs::ffi::PREGENERATED { "pregenerated" } else { "generated" };
    if std::env::args().nth(1).as_deref() == Some("--bindings") {
        println!("{bindings}");
        return Ok(());
    }
    let name = std::env::var("RDMA_DEVICE").ok();
    let ctx = Context::open(name.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::new(&ctx, 256)?;
    let a = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(64).max_recv_wr(64).build()?;
    let b = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(64).max_recv_wr(64).build()?;
    a.connect(&InitAttr::default(), &b.local_info(1)?)?;
    let writable = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
    b.connect(&writable, &a.local_info(1)?)?;

    let target = pd.register_remote_writable(AlignedBuf::new(4096)?, AccessFlags::REMOTE_WRITE)?;
    let mut src: Chunk = pd.register(AlignedBuf::new(4096)?, AccessFlags::LOCAL_WRITE)?.into_chunks(4096)?.remove(0);
    let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    src[..64].copy_from_slice(&pattern);

    let mut sq = a.send_queue::<Chunk>()?;
    sq.post(SendWr::write(src, 0..64, target.remote()?))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wc = loop {
        if let Some(wc) = cq.poll_one()? {
            break wc;
        }
        if Instant::now() > deadline {
            return Err("no completion for the RDMA WRITE within 20 s".into());
        }
    };
    wc.ok()?;
    sq.complete(&mut wc, |done| drop(done.value))?;

    let mut landed = [0u8; 64];
    target.read_at(0, &mut landed)?;
    if landed[..] != pattern[..] {
        return Err(format!("the 64 bytes did not arrive: {landed:02x?}").into());
    }
    println!("packaged-user: 64-byte RDMA WRITE between two RC QPs on {} verified ({bindings} bindings)", ctx.name());
    Ok(())
}
