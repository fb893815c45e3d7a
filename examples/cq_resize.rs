//! `cq_resize`: a completion queue grown with `CompletionQueue::resize` (`ibv_resize_cq`)
//! keeps the completions it holds and takes more.
//!
//! B's CQ is built just big enough for B's queues (8 sends + 8 receives), which the crate
//! reserves on it: a second QP on that CQ is refused before C. A sends 8 messages; their
//! receive completions wait on B's CQ while it is resized. After the resize the second QP
//! fits, sends 16 messages to itself, and all 8 + 32 completions come out of the resized
//! CQ with their bytes.
//!
//! ```text
//! scripts/rxe cargo run --example cq_resize
//! ```
//!
//! RC QPs on one device (`RDMA_DEVICE`, else the first): A and B connected to each other,
//! C to itself. One line per step; the exit code is 0 only when every check passed.

use std::time::Duration;

#[path = "common/area.rs"]
mod area;
use area::{chunks, ensure, pattern, poll_one, AnyError};

use rdma_verbs::{Chunk, CompletionQueue, Error, InitAttr, ProtectionDomain, QpType, QueuePair, SendWr};

const N: usize = 8;
const M: usize = 16;

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq_a = CompletionQueue::new(&ctx, 2 * N as u32)?;
    let mut cq_b = CompletionQueue::new(&ctx, 2 * N as u32)?;
    let rc = |cq: &CompletionQueue, depth: usize| {
        QueuePair::builder(&pd, QpType::Rc, cq, cq).max_send_wr(depth as u32).max_recv_wr(depth as u32).build()
    };
    let (a, b) = (rc(&cq_a, N)?, rc(&cq_b, N)?);
    a.connect(&InitAttr::default(), &b.local_info(1)?)?;
    b.connect(&InitAttr::default(), &a.local_info(1)?)?;
    let (mut sq, mut rq) = (a.send_queue::<Chunk>()?, b.recv_queue::<Chunk>()?);
    let (_b_sq, _a_rq) = (b.send_queue::<Chunk>()?, a.recv_queue::<Chunk>()?);

    // B's CQ is full of reservations: a QP of M + M more does not fit.
    let before = cq_b.cqe();
    match rc(&cq_b, M) {
        Err(e @ Error::InvalidArgument { .. }) => println!("before resize: a second QP is refused: {e}"),
        other => return Err(format!("a second QP on a CQ of {before} entries: {other:?}").into()),
    }

    // 8 messages from A to B: their receive completions wait on B's CQ, unpolled.
    for (i, c) in chunks(&pd, N, 1024)?.into_iter().enumerate() {
        rq.post(c, 0..1024, i as u64)?;
    }
    let payloads: Vec<Vec<u8>> = (0..N).map(|i| pattern(i as u8, 10 + 100 * i)).collect();
    for (mut c, data) in chunks(&pd, N, 1024)?.into_iter().zip(&payloads) {
        c[..data.len()].copy_from_slice(data);
        sq.post(SendWr::send(c, 0..data.len()))?;
    }
    let mut acked = 0;
    while acked < N {
        acked += sq.complete(&mut poll_one(&mut cq_a)?, |_| ())?;
    }
    std::thread::sleep(Duration::from_millis(50));

    let want = before + 2 * M as u32;
    let granted = cq_b.resize(want)?;
    ensure(granted >= want && cq_b.cqe() == granted, format!("asked {want} entries, granted {granted}"))?;
    println!("resize: {N} pending completions kept, {before} -> {granted} entries");

    // Now C fits, connected to itself: M messages, 2 * M completions on the same CQ.
    let c = rc(&cq_b, M)?;
    c.connect(&InitAttr::default(), &c.local_info(1)?)?;
    let (mut csq, mut crq) = (c.send_queue::<Chunk>()?, c.recv_queue::<Chunk>()?);
    for (i, buf) in chunks(&pd, M, 1024)?.into_iter().enumerate() {
        crq.post(buf, 0..1024, i as u64)?;
    }
    let more: Vec<Vec<u8>> = (0..M).map(|i| pattern(0x80 | i as u8, 500 + i)).collect();
    for (mut buf, data) in chunks(&pd, M, 1024)?.into_iter().zip(&more) {
        buf[..data.len()].copy_from_slice(data);
        csq.post(SendWr::send(buf, 0..data.len()))?;
    }
    println!("after resize: a second QP of {M} + {M} fits on the CQ and sent {M} messages to itself");

    // Everything comes out of the resized CQ: B's 8 first (they were there before), then C's.
    let (mut old, mut new, mut sends) = (0, 0, 0);
    while old < N || new < M || sends < M {
        let mut wc = poll_one(&mut cq_b)?;
        if wc.qp_num() == b.qp_num() {
            let got = rq.complete(&mut wc)?.result()?;
            ensure(got.value[..payloads[old].len()] == payloads[old][..], format!("B's message {old}"))?;
            old += 1;
        } else if wc.opcode().is_recv() {
            let got = crq.complete(&mut wc)?.result()?;
            ensure(got.value[..more[new].len()] == more[new][..], format!("C's message {new}"))?;
            new += 1;
        } else {
            let mut failed = None;
            sends += csq.complete(&mut wc, |d| failed = d.result().err())?;
            if let Some(e) = failed {
                return Err(e.into());
            }
        }
    }
    println!(
        "resized CQ: {} completions polled, the {N} pending ones and {M} messages checked byte for byte",
        N + 2 * M
    );
    Ok(())
}
