// A region over a borrowed slice cannot outlive the slice: the device could write freed memory.
use rdma_verbs::{AccessFlags, ProtectionDomain};

fn register(pd: &ProtectionDomain) {
    let mr;
    {
        let mut buf = vec![0u8; 64];
        mr = pd.register_slice(&mut buf, AccessFlags::LOCAL_WRITE).unwrap();
    }
    println!("{}", mr.lkey());
}

fn main() {}
