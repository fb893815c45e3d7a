// Memory a peer may write at any time is never handed out as a plain slice.
use rdma_verbs::{AccessFlags, AlignedBuf, ProtectionDomain};

fn register(pd: &ProtectionDomain) {
    let mr = pd.register_remote_writable(AlignedBuf::new(64).unwrap(), AccessFlags::REMOTE_WRITE).unwrap();
    let bytes: &[u8] = mr.as_slice();
    println!("{bytes:?}");
}

fn main() {}
