//! The s3dma batch request and reply parsers on arbitrary input: no panic;
//! a request accepted within the limits re-encodes to one that parses to
//! the same items, each of which checks without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use s3dma_wire::batch::{BatchReply, BatchRequest, Limits};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = BatchRequest::parse(data, Limits::default()) {
        for item in &r.items {
            let _ = item.check();
            let _ = item.window_bytes();
        }
        let again = r.encode().expect("encodes");
        assert_eq!(BatchRequest::parse(&again, Limits::default()).as_ref(), Ok(&r));
    }
    if let Ok(r) = BatchReply::parse(data, data.len() % 8) {
        let again = r.encode().expect("encodes");
        assert_eq!(BatchReply::parse(&again, r.items.len()).as_ref(), Ok(&r));
    }
});
