// One handle polls a CQ: it cannot be cloned into a second poller.
use rdma_verbs::CompletionQueue;

fn second_poller(cq: &CompletionQueue) -> CompletionQueue {
    cq.clone()
}

fn main() {
    let _ = second_poller;
}
