// A window's key is borrowed from the bound window: once the window is handed to an
// invalidation, the key (and the rkey it gives) can no longer be read.
use rdma_verbs::{BoundWindow, Chunk, MwSendQueue};

fn unbind(sq: &mut MwSendQueue<Chunk>, bound: BoundWindow) -> u32 {
    let key = bound.key();
    sq.invalidate_mw(bound, 1).unwrap();
    key.rkey()
}

fn main() {}
