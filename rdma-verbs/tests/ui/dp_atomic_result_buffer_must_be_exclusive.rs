// The device writes the old value of an atomic into the local buffer: a shared
// Arc<Chunk> is refused for compare-and-swap and fetch-and-add alike.
use std::sync::Arc;

use rdma_verbs::{Chunk, RemoteMr, SendWr};

fn atomics_into_shared(buf: Arc<Chunk>, remote: RemoteMr) {
    let _cas = SendWr::compare_swap(Arc::clone(&buf), 0, remote, 1, 2);
    let _faa = SendWr::fetch_add(buf, 0, remote, 1);
}

fn main() {
    let _ = atomics_into_shared;
}
