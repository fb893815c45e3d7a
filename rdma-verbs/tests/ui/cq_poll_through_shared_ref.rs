// A shared `&CompletionQueue` (what an `Arc<CompletionQueue>` or a `static` hands every
// thread) cannot poll: polling needs the one `&mut`.
use rdma_verbs::{CompletionQueue, WorkCompletion};

fn poll_shared(cq: &CompletionQueue, wcs: &mut [WorkCompletion]) -> usize {
    cq.poll(wcs).map(|done| done.len()).unwrap_or(0)
}

fn main() {
    let _ = poll_shared;
}
