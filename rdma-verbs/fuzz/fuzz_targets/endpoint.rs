//! The endpoint parser on arbitrary bytes: it never panics, and what it accepts
//! re-encodes to the very same bytes (one canonical encoding per endpoint), which parse
//! to the same endpoint again. The handshake status parser gets the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_verbs::wire::{Endpoint, Status};

fuzz_target!(|data: &[u8]| {
    if let Ok(ep) = Endpoint::from_bytes(data) {
        let bytes = ep.to_bytes();
        assert_eq!(&bytes[..], data, "accepted bytes are the canonical encoding");
        assert_eq!(Endpoint::from_bytes(&bytes), Ok(ep));
        assert_eq!(ep.validate(), Ok(()));
    }
    if let Ok(status) = Status::from_bytes(data) {
        assert_eq!(&status.to_bytes()[..], data);
    }
});
