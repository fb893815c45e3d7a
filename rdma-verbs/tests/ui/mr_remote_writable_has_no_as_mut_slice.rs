// Nor as a mutable slice.
use rdma_verbs::{AccessFlags, AlignedBuf, ProtectionDomain};

fn register(pd: &ProtectionDomain) {
    let mut mr = pd.register_remote_writable(AlignedBuf::new(64).unwrap(), AccessFlags::REMOTE_ATOMIC).unwrap();
    mr.as_mut_slice()[0] = 1;
}

fn main() {}
