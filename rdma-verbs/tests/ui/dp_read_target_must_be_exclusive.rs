// The device writes the target of an RDMA READ: a shared Arc<Chunk>, which other clones
// may be reading, is refused.
use std::sync::Arc;

use rdma_verbs::{Chunk, RemoteMr, SendWr};

fn read_into_shared(buf: Arc<Chunk>, remote: RemoteMr) -> SendWr<Arc<Chunk>> {
    SendWr::read(buf, 0..64, remote)
}

fn main() {
    let _ = read_into_shared;
}
