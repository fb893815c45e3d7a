// A region whose bytes are borrowed (here an atomic word a peer's atomics target) cannot be
// reregistered, or over a new buffer, until the borrow ends.
use std::sync::atomic::Ordering;

use rdma_verbs::{AccessFlags, AlignedBuf, Local, MemoryRegion, RemoteWritable};

fn rereg_under_a_view(mr: MemoryRegion<AlignedBuf, RemoteWritable>) {
    let word = mr.atomic_u64(0).unwrap();
    let _narrowed = mr.rereg_access::<Local>(AccessFlags::LOCAL_WRITE);
    word.load(Ordering::Relaxed);
}

fn main() {}
