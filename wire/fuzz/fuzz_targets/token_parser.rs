//! The x-amz-rdma-token parser on arbitrary input: no panic, and anything it
//! accepts formats back to exactly the input (the grammar is strict).
#![no_main]

use s3dma_wire::RdmaToken;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(t) = RdmaToken::parse(s) {
            assert_eq!(t.to_string(), s);
            let _ = t.endpoint();
            let _ = t.slice(u64::from(data[0]), u64::from(data[1]));
        }
    }
});
