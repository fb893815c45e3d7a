// A slice of a region's bytes ends before the region is destroyed.
use rdma_verbs::{AlignedBuf, MemoryRegion};

fn view(mr: MemoryRegion<AlignedBuf>) {
    let bytes = mr.as_slice();
    let _buf = mr.destroy();
    println!("{}", bytes[0]);
}

fn main() {}
