//! `cq_ex`: an extended completion queue (`ibv_create_cq_ex`), polled with
//! `ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` through `poll_extended`.
//!
//! A sends 8 messages with immediate data to B, whose QP completes on an extended CQ. B
//! polls them in batches of 3 and checks each: in order, once, with its length, its
//! immediate data, its QP number and its bytes. The fields an extended CQ can add
//! (`WcFields`: timestamps and others) are asked for at `CqBuilder::extended`; a device
//! without one refuses it with `Error::NotSupported` (`not_supported` shows which).
//!
//! ```text
//! scripts/rxe cargo run --example cq_ex
//! ```
//!
//! Two RC QPs on one device (`RDMA_DEVICE`, else the first), connected to each other. One
//! line per step; the exit code is 0 only when every check passed.

use std::time::{Duration, Instant};

#[path = "common/area.rs"]
mod area;
use area::{chunks, ensure, pattern, poll_one, AnyError};

use rdma_verbs::{
    Chunk, CompletionQueue, ExtendedCompletion, InitAttr, ProtectionDomain, QpType, QueuePair, SendWr, WcFields,
    WcOpcode, WcStatus,
};

const N: usize = 8;

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq_a = CompletionQueue::new(&ctx, 32)?;
    let mut cq_b = CompletionQueue::builder(&ctx, 32).extended(WcFields::empty()).build()?;
    println!("extended CQ: built with ibv_create_cq_ex, {} entries", cq_b.cqe());
    let a = QueuePair::builder(&pd, QpType::Rc, &cq_a, &cq_a).max_send_wr(N as u32).max_recv_wr(1).build()?;
    let b = QueuePair::builder(&pd, QpType::Rc, &cq_b, &cq_b).max_send_wr(1).max_recv_wr(N as u32).build()?;
    a.connect(&InitAttr::default(), &b.local_info(1)?)?;
    b.connect(&InitAttr::default(), &a.local_info(1)?)?;
    let (mut sq, mut rq) = (a.send_queue::<Chunk>()?, b.recv_queue::<Chunk>()?);

    for (i, c) in chunks(&pd, N, 1024)?.into_iter().enumerate() {
        rq.post(c, 0..1024, i as u64)?;
    }
    let payloads: Vec<Vec<u8>> = (0..N).map(|i| pattern(i as u8, 100 + 50 * i)).collect();
    for (i, (mut c, data)) in chunks(&pd, N, 1024)?.into_iter().zip(&payloads).enumerate() {
        c[..data.len()].copy_from_slice(data);
        sq.post(SendWr::send(c, 0..data.len()).imm(0x1000 + i as u32).id(i as u64))?;
    }
    let mut sent = 0;
    while sent < N {
        let mut failed = None;
        sent += sq.complete(&mut poll_one(&mut cq_a)?, |d| failed = d.result().err())?;
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    println!("sent: {N} messages with immediate data");

    // Out of 3 at a time: a batch ends on a full array or on an empty queue.
    let mut out: [ExtendedCompletion; 3] = std::array::from_fn(|_| ExtendedCompletion::EMPTY);
    let (mut next, deadline) = (0, Instant::now() + Duration::from_secs(10));
    while next < N {
        ensure(Instant::now() < deadline, format!("{next} of {N} receives within 10 s"))?;
        for c in cq_b.poll_extended(&mut out)?.iter_mut() {
            ensure(c.status() == WcStatus::Success && c.opcode() == WcOpcode::Recv, format!("{c:?}"))?;
            ensure(c.imm_data() == Some(0x1000 + next as u32), format!("out of order: {c:?}"))?;
            ensure(c.qp_num() == b.qp_num() && c.byte_len() as usize == payloads[next].len(), format!("{c:?}"))?;
            let done = rq.complete(c)?.result()?;
            ensure(done.value[..payloads[next].len()] == payloads[next][..], format!("the bytes of message {next}"))?;
            next += 1;
        }
    }
    println!("poll_extended: {N} receives, in order, each once with its length, immediate data, QP and bytes");
    std::thread::sleep(Duration::from_millis(50));
    ensure(cq_b.poll_extended(&mut out)?.is_empty(), "a completion came twice")?;
    println!("poll_extended: the CQ is empty afterwards");
    Ok(())
}
