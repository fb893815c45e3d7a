//! What the area examples (memory_window, multicast, cq_ex, cq_resize, rereg,
//! ah_from_completion, not_supported) share: the device they run on, a bounded poll and a
//! check that fails the program. Included by each with `#[path]`; not every example uses
//! every item.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, ProtectionDomain, WorkCompletion};

pub type AnyError = Box<dyn std::error::Error>;

/// The device named by `RDMA_DEVICE`, else the first one, opened.
pub fn open() -> Result<Context, AnyError> {
    let ctx = Context::open(std::env::var("RDMA_DEVICE").ok().as_deref())?;
    println!("device: {}", ctx.name());
    Ok(ctx)
}

/// The next completion on `cq`, waited for at most 10 s: a lost completion is a failure.
pub fn poll_one(cq: &mut CompletionQueue) -> Result<WorkCompletion, AnyError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [WorkCompletion::EMPTY; 1];
    loop {
        if let Some(w) = cq.poll(&mut wc)?.first_mut() {
            return Ok(std::mem::take(w));
        }
        if Instant::now() > deadline {
            return Err("no completion within 10 s".into());
        }
        std::hint::spin_loop();
    }
}

/// True when nothing arrives on `cq` for 300 ms.
pub fn stays_empty(cq: &mut CompletionQueue) -> Result<bool, AnyError> {
    let end = Instant::now() + Duration::from_millis(300);
    let mut wc = [WorkCompletion::EMPTY; 1];
    while Instant::now() < end {
        if !cq.poll(&mut wc)?.is_empty() {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(true)
}

/// `n` registered chunks of `len` bytes each, in one region.
pub fn chunks(pd: &ProtectionDomain, n: usize, len: usize) -> Result<Vec<Chunk>, AnyError> {
    Ok(pd.register(AlignedBuf::new(n * len)?, AccessFlags::LOCAL_WRITE)?.into_chunks(len)?)
}

/// `len` bytes of a pattern that differs with `seed`: data in the wrong place shows.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Fails the program with `what` unless `ok`.
pub fn ensure(ok: bool, what: impl Into<String>) -> Result<(), AnyError> {
    if ok {
        Ok(())
    } else {
        Err(what.into().into())
    }
}
