// The PSN is chosen once, when the QP is built: `local_info` advertises it and `connect`
// sends from it, so there is no second PSN to pass that could differ from the first.
use rdma_verbs::{CompletionQueue, Context, InitAttr, ProtectionDomain, QpType, QueuePair};

fn main() {
    let ctx = Context::open_first().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 256).unwrap();
    let qp = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).build().unwrap();
    let me = qp.local_info(1).unwrap();
    qp.connect(&InitAttr::default(), me.psn + 1, &me).unwrap();
}
