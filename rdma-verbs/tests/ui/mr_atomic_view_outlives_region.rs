// An atomic view of a word ends before the region is deregistered and its buffer freed.
use std::sync::atomic::Ordering;

use rdma_verbs::{AlignedBuf, MemoryRegion, RemoteWritable};

fn view(mr: MemoryRegion<AlignedBuf, RemoteWritable>) {
    let word = mr.atomic_u64(0).unwrap();
    drop(mr);
    word.load(Ordering::Relaxed);
}

fn main() {}
