// Binding moves the window into the queue: it cannot be bound twice, or used, while the
// bind is posted; it comes back with the completion.
use std::sync::Arc;

use rdma_verbs::{AccessFlags, AlignedBuf, Chunk, MemoryRegion, MemoryWindow, MwBind, MwSendQueue, RemoteWritable};

fn bind_twice(
    sq: &mut MwSendQueue<Chunk>,
    window: MemoryWindow,
    region: &Arc<MemoryRegion<AlignedBuf, RemoteWritable>>,
) {
    sq.bind_mw(MwBind::new(window, region, 0..64, AccessFlags::REMOTE_WRITE)).unwrap();
    sq.bind_mw(MwBind::new(window, region, 64..128, AccessFlags::REMOTE_WRITE)).unwrap();
}

fn main() {}
