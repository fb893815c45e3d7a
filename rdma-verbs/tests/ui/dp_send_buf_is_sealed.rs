// A buffer's SGEs tell the device which bytes to read or write, so the data path trusts
// them. A type outside the crate cannot claim to be a buffer: it could name bytes a Chunk
// that someone else holds still lends out.
use std::mem::MaybeUninit;
use std::ops::Range;

use rdma_verbs::ffi;
use rdma_verbs::{ExclusiveBuf, PdId, SendBuf};
use rdma_verbs::{Result, Verb};

struct Forged(u64, u32);

impl SendBuf for Forged {
    fn total_len(&self) -> usize {
        4096
    }
    fn sges(&self, _: Verb, _: Range<usize>, _: PdId, out: &mut [MaybeUninit<ffi::ibv_sge>; 8]) -> Result<usize> {
        out[0].write(ffi::ibv_sge { addr: self.0, length: 4096, lkey: self.1 });
        Ok(1)
    }
}

impl ExclusiveBuf for Forged {}

fn main() {}
