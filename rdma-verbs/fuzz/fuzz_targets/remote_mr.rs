//! The memory-region descriptor a peer sends (`RemoteMr::from_bytes`) on arbitrary bytes:
//! it never panics, accepts exactly 20 bytes whose range does not overflow, and what it
//! accepts re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_verbs::RemoteMr;

fuzz_target!(|data: &[u8]| {
    if let Ok(mr) = RemoteMr::from_bytes(data) {
        assert_eq!(data.len(), RemoteMr::WIRE_LEN);
        assert!(mr.addr.checked_add(mr.len).is_some());
        assert_eq!(&mr.to_bytes()[..], data);
        // Any slice of an accepted region stays inside it.
        let half = mr.len / 2;
        let s = mr.slice(half..).expect("the upper half is inside");
        assert_eq!(s.addr + s.len, mr.addr + mr.len);
    }
});
