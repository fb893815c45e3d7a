// A posted receive buffer belongs to the queue until its completion hands it back: the
// program can neither read it, nor write it, nor post it a second time meanwhile.
use rdma_verbs::{Chunk, RecvQueue};

fn post_then_read(rq: &mut RecvQueue<Chunk>, buf: Chunk) -> u8 {
    let _ = rq.post(buf, 0..64, 1);
    buf[0]
}

fn main() {
    let _ = post_then_read;
}
