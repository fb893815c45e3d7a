// A peer may write a chunk of a remote-writable region at any time: it is never seen as
// a plain &[u8].
use rdma_verbs::{Chunk, RemoteWritable};

fn look(chunk: &Chunk<RemoteWritable>) -> u8 {
    let bytes: &[u8] = chunk;
    bytes[0]
}

fn main() {
    let _ = look;
}
