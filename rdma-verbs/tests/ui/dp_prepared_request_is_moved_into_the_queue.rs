// A prepared request is posted by value: while the device may read its buffer, the
// program has no handle left to write its bytes through, nor to post it a second time.
use rdma_verbs::{Chunk, PreparedSend, PreparedSendQueue};

fn post_then_touch(pq: &mut PreparedSendQueue<Chunk>, mut p: PreparedSend<Chunk>) {
    pq.post(p).unwrap();
    p.bytes_mut()[0] = 1;
    pq.post(p).unwrap();
}

fn main() {
    let _ = post_then_touch;
}
