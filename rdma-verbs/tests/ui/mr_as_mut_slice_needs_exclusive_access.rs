// A shared region gives only shared bytes.
use rdma_verbs::{AlignedBuf, MemoryRegion};

fn write(mr: &MemoryRegion<AlignedBuf>) {
    mr.as_mut_slice()[0] = 1;
}

fn main() {}
