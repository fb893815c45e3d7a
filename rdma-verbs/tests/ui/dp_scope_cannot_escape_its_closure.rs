// The scope is lent to its closure only: kept beyond it, it could post after the drain
// at the scope's end.
use rdma_verbs::{CompletionQueue, QueuePair, SendScope};

fn keep_the_scope<'env>(qp: &QueuePair, cq: &mut CompletionQueue, keep: &mut Option<&SendScope<'_, 'env>>) {
    qp.send_scope(cq, 8, |s| {
        *keep = Some(s);
    })
    .unwrap();
}

fn main() {
    let _ = keep_the_scope;
}
