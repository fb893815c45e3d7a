// Each side of a QP has one owner: a send queue cannot be duplicated into a second poster.
use rdma_verbs::{Chunk, SendQueue};

fn second_poster(sq: &SendQueue<Chunk>) -> SendQueue<Chunk> {
    sq.clone()
}

fn main() {
    let _ = second_poster;
}
