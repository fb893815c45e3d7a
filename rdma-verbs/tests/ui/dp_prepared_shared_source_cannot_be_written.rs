// A prepared request over a shared Arc<Chunk> may not write the bytes: other clones of
// the chunk may be posted elsewhere, and the device reads them.
use std::sync::Arc;

use rdma_verbs::{Chunk, PreparedSend};

fn write_shared(p: &mut PreparedSend<Arc<Chunk>>) {
    p.bytes_mut()[0] = 1;
}

fn main() {
    let _ = write_shared;
}
