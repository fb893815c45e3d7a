// A QP cannot be built without its completion queues: they are arguments of the builder,
// not optional setters, so forgetting them is a compile error rather than an EINVAL.
use rdma_verbs::{Context, ProtectionDomain, QpType, QueuePair};

fn main() {
    let ctx = Context::open_first().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let _qp = QueuePair::builder(&pd, QpType::Rc).build();
}
