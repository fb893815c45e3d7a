// Posting needs the queue mutably: two threads cannot post to one send queue at once.
use rdma_verbs::{Chunk, SendQueue, SendWr};

fn two_posters(sq: &mut SendQueue<Chunk>, a: Chunk, b: Chunk) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = sq.post(SendWr::send(a, 0..1));
        });
        s.spawn(|| {
            let _ = sq.post(SendWr::send(b, 0..1));
        });
    });
}

fn main() {
    let _ = two_posters;
}
