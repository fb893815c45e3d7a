// A prepared request is posted by value: while the device may read its buffer, the
// program has no handle left to write its bytes through, nor to post it a second time.
use rdma_verbs::{Chunk, Prepared, PreparedQueue};

fn post_then_touch(pq: &mut PreparedQueue<Chunk>, mut p: Prepared<Chunk>) {
    pq.post(p).unwrap();
    p.bytes_mut()[0] = 1;
    pq.post(p).unwrap();
}

fn main() {
    let _ = post_then_touch;
}
