// The device writes receive buffers: a QP's receive queue and an SRQ's queue take only
// buffers nobody else can reach, never shared Arc<Chunk>s.
use std::sync::Arc;

use rdma_verbs::{Chunk, QueuePair, SharedReceiveQueue};

fn shared_receives(qp: &QueuePair, srq: &SharedReceiveQueue) {
    let _rq = qp.recv_queue::<Arc<Chunk>>();
    let _srqq = srq.queue::<Arc<Chunk>>();
}

fn main() {
    let _ = shared_receives;
}
