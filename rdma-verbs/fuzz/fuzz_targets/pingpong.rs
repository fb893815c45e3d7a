//! The parser of rdma-core's pingpong text message on arbitrary bytes: it never panics,
//! and what it accepts re-encodes to a message that parses to the same address (the
//! encoding writes lower-case hex, so the bytes may differ in case only).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_verbs::wire::pingpong;

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = pingpong::decode(data) {
        let msg = pingpong::encode(&info).expect("a decoded address fits the format");
        assert!(msg.eq_ignore_ascii_case(data), "re-encoding changes only the case");
        assert_eq!(pingpong::decode(&msg), Ok(info));
    }
    let _ = pingpong::check_done(data);
});
