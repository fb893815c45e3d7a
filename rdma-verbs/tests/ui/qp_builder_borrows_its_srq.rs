// The builder borrows the SRQ whose pointer it hands to C: the SRQ cannot be dropped
// between `.srq(&srq)` and `build()`. (After build the QP holds the SRQ itself.)
use rdma_verbs::{CompletionQueue, Context, ProtectionDomain, QpType, QueuePair, SharedReceiveQueue};

fn main() {
    let ctx = Context::open_first().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 8).unwrap();
    let srq = SharedReceiveQueue::new(&pd, 8, 1).unwrap();
    let builder = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).srq(&srq);
    drop(srq);
    let _qp = builder.build();
}
