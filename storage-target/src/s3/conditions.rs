//! What a read selects of an object: the conditional headers checked
//! against it (304/412), then the byte range or part, with its
//! `Content-Range`; a copy source's range; the checksum a read returns.

use http::HeaderMap;
use s3dma_wire::range::content_range;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};

use super::dto::byte_range;
use super::error::WithStatus as _;
use crate::checksum;
use crate::store::ObjectMeta;
use crate::store::conditions::{Conditions, Verdict};

/// Evaluates read conditions; errors are 304 (with ETag/Last-Modified) or 412.
/// What GET and HEAD select of an object, by one rule: the conditional
/// headers checked against it, then the byte range resolved, with its
/// `Content-Range` when the request named one.
pub(super) fn select(
    meta: &ObjectMeta,
    conds: &Conditions,
    range: Option<Range>,
    part: Option<i32>,
) -> S3Result<(std::ops::Range<u64>, Option<String>)> {
    check_conditions(conds, meta)?;
    match (range, part) {
        (Some(_), Some(_)) => Err(s3_error!(
            InvalidRequest,
            "Cannot specify both Range header and partNumber query parameter"
        )),
        (None, Some(n)) => {
            let r = part_range(meta, n)?;
            let cr = (!r.is_empty()).then(|| content_range(&r, meta.size));
            Ok((r, cr))
        }
        (None, None) => Ok((0..meta.size, None)),
        (Some(r), None) => {
            let r = byte_range(r)
                .resolve(meta.size)
                .map_err(|_| s3_error!(InvalidRange, "The requested range is not satisfiable"))?;
            let cr = content_range(&r, meta.size);
            Ok((r, Some(cr)))
        }
    }
}

/// The bytes of part `n` (GetObject/HeadObject `partNumber`): a part of a
/// multipart object, or part 1 = the whole of any other object.
pub(super) fn part_range(meta: &ObjectMeta, n: i32) -> S3Result<std::ops::Range<u64>> {
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=10_000).contains(n))
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            )
        })?;
    let unsatisfiable = || {
        S3Error::with_message(
            S3ErrorCode::Custom("InvalidPartNumber".into()),
            "The requested partnumber is not satisfiable",
        )
        .with_status(http::StatusCode::RANGE_NOT_SATISFIABLE)
    };
    match (meta.parts.is_empty(), meta.parts_count) {
        (false, _) => {
            let part = meta.parts.get(n - 1).ok_or_else(unsatisfiable)?;
            let start: u64 = meta.parts[..n - 1].iter().map(|p| p.size).sum();
            Ok(start..start + part.size)
        }
        (true, None) if n == 1 => Ok(0..meta.size),
        (true, None) => Err(unsatisfiable()),
        (true, Some(count)) if n > count as usize => Err(unsatisfiable()),
        // Multipart objects written before part sizes were recorded.
        (true, Some(_)) => Err(s3_error!(
            NotImplemented,
            "This object's part sizes were not recorded (it was written by an older storage-target); read it by range"
        )),
    }
}

/// The checksum a GetObject/HeadObject returns, only with
/// `x-amz-checksum-mode: ENABLED`: with `partNumber` on a multipart
/// object, that part's checksum (with the object's checksum type, as AWS
/// answers part requests); otherwise the object's, for the whole object
/// only (a ranged read gets none, as from AWS S3).
pub(super) fn returned_checksum(
    meta: &ObjectMeta,
    mode: Option<&ChecksumMode>,
    whole_object: bool,
    part_number: Option<i32>,
) -> Option<Checksum> {
    if !checksum::mode_enabled(mode) {
        return None;
    }
    if let Some(n) = part_number
        && !meta.parts.is_empty()
    {
        return u32::try_from(n)
            .ok()
            .and_then(|n| meta.part_checksum(n))
            .map(|c| c.to_dto());
    }
    if !whole_object {
        return None;
    }
    meta.checksum.as_ref().map(checksum::StoredChecksum::to_dto)
}

pub(super) fn check_conditions(c: &Conditions, meta: &ObjectMeta) -> S3Result<()> {
    check_conditions_of(c, &meta.etag, meta.last_modified_secs())
}

/// [`check_conditions`] against an object's ETag and last-modified time
/// (Unix seconds) as the index holds them.
pub(super) fn check_conditions_of(
    c: &Conditions,
    etag: &str,
    last_modified_secs: i64,
) -> S3Result<()> {
    match c.evaluate(etag, last_modified_secs) {
        Verdict::Proceed => Ok(()),
        Verdict::PreconditionFailed => Err(s3_error!(
            PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold"
        )),
        Verdict::NotModified => {
            let mut err = s3_error!(NotModified, "Not Modified");
            let mut h = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_str(&format!("\"{etag}\"")) {
                h.insert(http::header::ETAG, v);
            }
            let lm = httpdate::fmt_http_date(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs(
                        u64::try_from(last_modified_secs).unwrap_or(0),
                    ),
            );
            if let Ok(v) = http::HeaderValue::from_str(&lm) {
                h.insert(http::header::LAST_MODIFIED, v);
            }
            err.set_headers(h);
            Err(err)
        }
    }
}

/// The bytes `x-amz-copy-source-range: bytes=first-last` names in a source
/// of `size` bytes (the whole source without it), with AWS's refusals.
pub(super) fn copy_source_range(v: Option<&str>, size: u64) -> S3Result<std::ops::Range<u64>> {
    let Some(v) = v else {
        return Ok(0..size);
    };
    let parsed = v.strip_prefix("bytes=").and_then(|r| {
        let (a, b) = r.split_once('-')?;
        let a: u64 = a.parse().ok()?;
        let b: u64 = b.parse().ok()?;
        (a <= b).then_some((a, b))
    });
    let Some((first, last)) = parsed else {
        return Err(s3_error!(
            InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy"
        ));
    };
    if last >= size {
        // Past the source's end: InvalidRange (416), what SDKs and ceph's
        // s3-tests expect; a malformed value stays InvalidArgument.
        return Err(s3_error!(
            InvalidRange,
            "Range specified is not valid for source object of size: {size}"
        ));
    }
    Ok(first..last + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_ranges() {
        use crate::store::format::PartMeta;
        let mut meta = ObjectMeta {
            size: 25,
            parts_count: Some(3),
            parts: [10, 10, 5]
                .into_iter()
                .map(|size| PartMeta {
                    size,
                    checksum: None,
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(part_range(&meta, 1).unwrap(), 0..10);
        assert_eq!(part_range(&meta, 3).unwrap(), 20..25);
        let code = |r: S3Result<std::ops::Range<u64>>| r.unwrap_err().code().as_str().to_owned();
        assert_eq!(code(part_range(&meta, 4)), "InvalidPartNumber");
        assert_eq!(code(part_range(&meta, 0)), "InvalidArgument");
        meta.parts.clear();
        assert_eq!(code(part_range(&meta, 2)), "NotImplemented");
        meta.parts_count = None;
        assert_eq!(part_range(&meta, 1).unwrap(), 0..25);
        assert_eq!(code(part_range(&meta, 2)), "InvalidPartNumber");
    }
}
