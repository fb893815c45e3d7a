// A prepared receive is posted by value: while the device may write its buffer, the
// program has no handle left to read its bytes through, nor to post it a second time.
use rdma_verbs::{Chunk, PreparedRecv, PreparedRecvQueue};

fn post_then_read(rq: &mut PreparedRecvQueue<Chunk>, p: PreparedRecv<Chunk>) -> u8 {
    rq.post(p).unwrap();
    let first = p.buf()[0];
    rq.post(p).unwrap();
    first
}

fn main() {
    let _ = post_then_read;
}
