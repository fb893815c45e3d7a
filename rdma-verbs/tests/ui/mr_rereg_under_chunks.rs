// A region cut into chunks cannot be reregistered under them: the chunks took it for good,
// and a chunk posted to a queue keeps the memory registered as it was.
use rdma_verbs::{AccessFlags, AlignedBuf, Local, MemoryRegion, RemoteWritable};

fn rereg_under_chunks(mr: MemoryRegion<AlignedBuf, Local>) {
    let chunks = mr.into_chunks(64).unwrap();
    let _widened = mr.rereg_access::<RemoteWritable>(AccessFlags::REMOTE_WRITE);
    drop(chunks);
}

fn main() {}
