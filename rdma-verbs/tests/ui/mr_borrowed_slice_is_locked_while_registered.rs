// While registered, the slice is reachable only through the region.
use rdma_verbs::{AccessFlags, ProtectionDomain};

fn register(pd: &ProtectionDomain) {
    let mut buf = [0u8; 64];
    let mr = pd.register_slice(&mut buf, AccessFlags::LOCAL_WRITE).unwrap();
    buf.fill(1);
    drop(mr);
}

fn main() {}
