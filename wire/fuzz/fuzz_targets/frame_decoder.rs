//! Every fabric decoder of s3dma-wire (tcp frames, the responder's
//! per-request decision, the verbs queue-pair message) on arbitrary bytes: no
//! panic, and whatever decodes re-encodes to the same bytes (the format has
//! no slack: reserved fields must be zero).
#![no_main]

use libfuzzer_sys::fuzz_target;
use s3dma_wire::frame::{
    Auth, Challenge, Hello, Incoming, RequestHeader, RequestScanner, ResponseHeader, ScanEvent,
    Verdict,
};
use s3dma_wire::qp::QpInfo;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = RequestHeader::decode(data) {
        assert_eq!(&h.encode()[..], &data[..RequestHeader::LEN]);
    }
    // The tcp responder's own per-request decision.
    if let Ok(i) = Incoming::decode(data) {
        let h = match i {
            Incoming::Serve(h) | Incoming::TooLong(h) => h,
        };
        assert_eq!(&h.encode()[..], &data[..RequestHeader::LEN]);
        assert!(i.payload_len() <= s3dma_wire::frame::MAX_PIECE_LEN);
    }
    if let Ok(h) = ResponseHeader::decode(data) {
        assert_eq!(&h.encode()[..], &data[..ResponseHeader::LEN]);
    }
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(&h.encode()[..], &data[..Hello::LEN]);
    }
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(&c.encode()[..], &data[..Challenge::LEN]);
    }
    if let Ok(a) = Auth::decode(data) {
        assert_eq!(&a.encode()[..], &data[..Auth::LEN]);
    }
    if let Ok(v) = Verdict::decode(data) {
        assert_eq!(&v.encode()[..], &data[..Verdict::LEN]);
    }
    if let Ok(q) = QpInfo::decode(data) {
        assert_eq!(&q.encode()[..], &data[..QpInfo::LEN]);
    }
    // The request stream, fed in pieces whose size the first byte picks.
    if let Some((&step, rest)) = data.split_first() {
        let step = (step as usize % 37) + 1;
        let mut whole = RequestScanner::new();
        let mut a = Vec::new();
        let ra = whole.push(rest, &mut a);
        let mut pieces = RequestScanner::new();
        let mut b = Vec::new();
        let mut rb = Ok(());
        for chunk in rest.chunks(step) {
            rb = pieces.push(chunk, &mut b);
            if rb.is_err() {
                break;
            }
        }
        assert_eq!(ra.is_ok(), rb.is_ok());
        // Same requests in the same order, whatever the chunking.
        let reqs = |ev: &[ScanEvent]| {
            ev.iter()
                .filter(|e| !matches!(e, ScanEvent::Payload(_)))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(reqs(&a), reqs(&b));
    }
});
