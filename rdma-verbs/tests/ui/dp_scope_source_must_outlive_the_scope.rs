// A scoped send's source must outlive the whole scope: one made (and dropped) inside the
// scope's closure could be freed while the device still reads it.
use rdma_verbs::{Chunk, CompletionQueue, QueuePair, RemoteMr};

fn short_lived_source(qp: &QueuePair, cq: &mut CompletionQueue, make: &dyn Fn() -> Chunk, remote: RemoteMr) {
    qp.send_scope(cq, 8, |s| {
        let src = make();
        let mut chain = s.chain();
        chain.write(&src, 0..64, remote).unwrap();
        s.post(&mut chain).unwrap();
    })
    .unwrap();
}

fn main() {
    let _ = short_lived_source;
}
