// The completions a poll returned live in the caller's buffer: polling into that buffer
// again while they are still being read would overwrite them, so it does not compile.
use rdma_verbs::{CompletionQueue, WorkCompletion};

fn reuse(cq: &mut CompletionQueue) -> u64 {
    let mut wcs = [WorkCompletion::EMPTY; 4];
    let first = cq.poll(&mut wcs).unwrap();
    let _second = cq.poll(&mut wcs).unwrap();
    first.iter().map(|wc| wc.wr_id()).sum()
}

fn main() {
    let _ = reuse;
}
