// A source posted as an Arc<Chunk> may be read by the device until every clone is back:
// the clone the program kept cannot be written meanwhile.
use std::sync::Arc;

use rdma_verbs::{Chunk, SendQueue, SendWr};

fn post_then_write(sq: &mut SendQueue<Arc<Chunk>>, src: Arc<Chunk>) {
    let _ = sq.post(SendWr::send(Arc::clone(&src), 0..64));
    src[0] = 1;
}

fn main() {
    let _ = post_then_write;
}
