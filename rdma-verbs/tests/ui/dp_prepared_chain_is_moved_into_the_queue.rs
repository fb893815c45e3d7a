// A prepared chain is posted by value: while the device may read its buffers, the program
// has no handle left to reach a part through, nor to post it a second time.
use rdma_verbs::{SendChainQueue, Chunk, PreparedSendChain};

fn post_then_touch(cq: &mut SendChainQueue<Chunk>, mut chain: PreparedSendChain<Chunk>) {
    cq.post(chain).unwrap();
    chain.get_mut(0).unwrap().bytes_mut()[0] = 1;
    cq.post(chain).unwrap();
}

fn main() {
    let _ = post_then_touch;
}
