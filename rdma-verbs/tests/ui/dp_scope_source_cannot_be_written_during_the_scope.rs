// A scoped send borrows its source for the whole scope: the program cannot write it
// until send_scope has returned, when every request that reads it has completed.
use rdma_verbs::{Chunk, CompletionQueue, QueuePair, RemoteMr};

fn write_while_posted(qp: &QueuePair, cq: &mut CompletionQueue, mut src: Chunk, remote: RemoteMr) {
    qp.send_scope(cq, 8, |s| {
        let mut chain = s.chain();
        chain.write(&src, 0..64, remote).unwrap();
        s.post(&mut chain).unwrap();
        src[0] = 1;
    })
    .unwrap();
}

fn main() {
    let _ = write_while_posted;
}
