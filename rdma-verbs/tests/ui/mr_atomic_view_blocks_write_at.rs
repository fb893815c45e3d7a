// write_at needs the region exclusively: no atomic view may be alive meanwhile.
use std::sync::atomic::Ordering;

use rdma_verbs::{AlignedBuf, MemoryRegion, RemoteWritable};

fn write(mr: &mut MemoryRegion<AlignedBuf, RemoteWritable>) {
    let word = mr.atomic_u64(0).unwrap();
    mr.write_at(0, &[1, 2, 3]).unwrap();
    word.store(5, Ordering::Relaxed);
}

fn main() {}
