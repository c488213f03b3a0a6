//! The aws-chunked check: a request body sent aws-chunked
//! (`x-amz-content-sha256: STREAMING-...`) whose chunk header declares more
//! than `max_aws_chunk_size` bytes is refused before a byte of that chunk is
//! read (s3s buffers a whole chunk to check its signature, so the chunk
//! size the client declares would otherwise be memory the server holds).

/// The start of the message of a request body refused for its aws-chunked
/// framing (mapped to `400 InvalidRequest` by the S3 front ends).
pub(crate) const AWS_CHUNK_REFUSED: &str = "aws-chunked body refused";

pub use crate::config::DEFAULT_MAX_AWS_CHUNK;

/// Why an aws-chunked body is refused (its display starts with
/// [`AWS_CHUNK_REFUSED`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{AWS_CHUNK_REFUSED}: {0}")]
pub(crate) struct ChunkRefused(String);

/// Longest aws-chunked chunk header line (size, `;chunk-signature=` and 64
/// hex digits, CRLF) the check follows; s3s refuses longer ones as well.
const MAX_CHUNK_HEADER: usize = 1024;
/// Follows the framing of an aws-chunked body (`hex-size[;ext]\r\n`,
/// `size` bytes, `\r\n`, ..., a 0-size chunk, trailers) as its bytes pass,
/// and refuses a chunk header that declares more than `max` bytes (or is
/// malformed) as soon as its size digits show it.
#[derive(Debug)]
pub(crate) struct ChunkCheck {
    max: u64,
    state: Framing,
}

#[derive(Debug, Clone, Copy)]
enum Framing {
    /// In a chunk header line: the size so far, its hex digits, whether
    /// the size field is still being read, the line's length so far.
    Header {
        size: u64,
        digits: u8,
        in_size: bool,
        len: usize,
    },
    /// In a chunk's data and the CRLF after it: bytes left.
    Data(u64),
    /// After the final 0-size chunk: trailers (which s3s bounds).
    Trailer,
}

const HEADER_START: Framing = Framing::Header {
    size: 0,
    digits: 0,
    in_size: true,
    len: 0,
};

impl ChunkCheck {
    /// A check refusing chunks larger than `max` bytes.
    pub(crate) fn new(max: u64) -> ChunkCheck {
        ChunkCheck {
            max,
            state: HEADER_START,
        }
    }

    /// Follows `b`, the next bytes of the body.
    ///
    /// # Errors
    /// Why the body is refused (the message starts with [`AWS_CHUNK_REFUSED`]).
    pub(crate) fn feed(&mut self, mut b: &[u8]) -> Result<(), ChunkRefused> {
        let refuse = |why: String| Err(ChunkRefused(why));
        while let Some((&c, rest)) = b.split_first() {
            match self.state {
                Framing::Trailer => return Ok(()),
                Framing::Data(left) => {
                    let n = left.min(b.len() as u64);
                    b = &b[usize::try_from(n).unwrap_or(b.len())..];
                    self.state = if left == n {
                        HEADER_START
                    } else {
                        Framing::Data(left - n)
                    };
                }
                Framing::Header {
                    size,
                    digits,
                    in_size,
                    len,
                } => {
                    b = rest;
                    let len = len + 1;
                    if len > MAX_CHUNK_HEADER {
                        return refuse(format!(
                            "a chunk header is longer than {MAX_CHUNK_HEADER} bytes"
                        ));
                    }
                    if in_size {
                        if c == b';' || c == b'\r' {
                            if digits == 0 {
                                return refuse("a chunk header has no size".into());
                            }
                            self.state = Framing::Header {
                                size,
                                digits,
                                in_size: false,
                                len,
                            };
                            continue;
                        }
                        let Some(d) = char::from(c).to_digit(16) else {
                            return refuse("a chunk size is not hexadecimal".into());
                        };
                        if digits >= 8 {
                            return refuse("a chunk size has more than 8 hex digits".into());
                        }
                        let size = size * 16 + u64::from(d);
                        if size > self.max {
                            return refuse(format!(
                                "a chunk declares at least {size} bytes, more than this server's limit of {} bytes per chunk (max_aws_chunk_size); send smaller chunks",
                                self.max
                            ));
                        }
                        self.state = Framing::Header {
                            size,
                            digits: digits + 1,
                            in_size,
                            len,
                        };
                    } else if c == b'\n' {
                        // The data, then its CRLF.
                        self.state = if size == 0 {
                            Framing::Trailer
                        } else {
                            Framing::Data(size + 2)
                        };
                    } else {
                        self.state = Framing::Header {
                            size,
                            digits,
                            in_size,
                            len,
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(max: u64, parts: &[&[u8]]) -> Result<(), String> {
        let mut c = ChunkCheck::new(max);
        parts
            .iter()
            .try_for_each(|p| c.feed(p))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn aws_chunk_framing_is_followed_and_big_chunks_refused() {
        let sig = format!(";chunk-signature={}\r\n", "0".repeat(64));
        let body = format!("10{sig}{}\r\n4{sig}abcd\r\n0{sig}\r\n", "x".repeat(16));
        check(16, &[body.as_bytes()]).unwrap();
        // Byte by byte, as a slow client sends it.
        let bytes: Vec<&[u8]> = body.as_bytes().chunks(1).collect();
        check(16, &bytes).unwrap();
        // Unsigned (trailer) framing, and trailers after the last chunk.
        check(
            16,
            &[b"10\r\n0123456789abcdef\r\n0\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"],
        )
        .unwrap();
        // A chunk one byte over the limit, in its first or a later chunk;
        // refused at its size digits, before its line ends.
        let e = check(16, &[b"11"]).unwrap_err();
        assert!(
            e.starts_with(AWS_CHUNK_REFUSED) && e.contains("max_aws_chunk_size"),
            "{e}"
        );
        let later = format!("10{sig}{}\r\n40000000", "x".repeat(16));
        assert!(check(16, &[later.as_bytes()]).is_err());
        // Data that looks like a header is data.
        let fake = format!("4{sig}ffff\r\n0{sig}");
        check(16, &[fake.as_bytes()]).unwrap();
        // Malformed sizes: not hex, empty, more digits than s3s reads.
        for bad in [&b"zz\r\n"[..], b";chunk-signature=", b"000000001\r\n"] {
            assert!(check(u64::MAX, &[bad]).is_err(), "{bad:?}");
        }
        assert!(check(u64::MAX, &[&[b'1'; 2000]]).is_err());
    }
}
