//! GetObjectAttributes: the attributes `x-amz-object-attributes` asks for
//! (`ETag`, `Checksum`, `ObjectParts`, `StorageClass`, `ObjectSize`), built
//! from an object's stored metadata (pure).

use s3s::dto::{
    GetObjectAttributesInput, GetObjectAttributesOutput, GetObjectAttributesParts, ObjectPart,
    StorageClass, Timestamp,
};
use s3s::{S3Result, s3_error};

use crate::checksum::{Algorithm, ChecksumType, StoredChecksum, set_checksum};
use crate::store::ObjectMeta;

/// Which attributes a request names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wanted {
    /// `ETag`.
    pub etag: bool,
    /// `Checksum`.
    pub checksum: bool,
    /// `ObjectParts`.
    pub parts: bool,
    /// `StorageClass`.
    pub storage_class: bool,
    /// `ObjectSize`.
    pub size: bool,
}

impl Wanted {
    /// Parses the `x-amz-object-attributes` values (each may be a
    /// comma-separated list, as the SDKs send it).
    ///
    /// # Errors
    /// `InvalidArgument` for a name S3 does not know.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> S3Result<Wanted> {
        let mut w = Wanted::default();
        for name in values.into_iter().flat_map(|v| v.split(',')) {
            match name.trim() {
                "ETag" => w.etag = true,
                "Checksum" => w.checksum = true,
                "ObjectParts" => w.parts = true,
                "StorageClass" => w.storage_class = true,
                "ObjectSize" => w.size = true,
                "" => {}
                _ => {
                    return Err(s3_error!(
                        InvalidArgument,
                        "Invalid attribute name specified."
                    ));
                }
            }
        }
        Ok(w)
    }
}

/// Builds the GetObjectAttributes answer for `meta`.
///
/// `ObjectParts` is returned for multipart objects only: `PartsCount`, and
/// the parts (number, size, checksum) after `x-amz-part-number-marker`, at
/// most `x-amz-max-parts` (default and cap 1000), with `IsTruncated` and
/// `NextPartNumberMarker`.
///
/// # Errors
/// `InvalidArgument` for an unknown attribute or a negative paging value.
pub fn get_object_attributes(
    meta: &ObjectMeta,
    input: &GetObjectAttributesInput,
    last_modified: Timestamp,
) -> S3Result<GetObjectAttributesOutput> {
    let want = Wanted::parse(input.object_attributes.iter().map(|a| a.as_str()))?;
    let mut out = GetObjectAttributesOutput {
        last_modified: Some(last_modified),
        ..Default::default()
    };
    if want.etag {
        out.e_tag = Some(s3s::dto::ETag::Strong(meta.etag.clone()));
    }
    if want.checksum
        && let Some(c) = &meta.checksum
    {
        // A COMPOSITE value with its `-<N>` suffix, as CompleteMultipartUpload
        // and HeadObject give it.
        out.checksum = Some(c.to_dto());
    }
    if want.storage_class {
        out.storage_class = Some(StorageClass::from_static(StorageClass::STANDARD));
    }
    if want.size {
        out.object_size = Some(i64::try_from(meta.size).unwrap_or(i64::MAX));
    }
    if want.parts
        && let Some(count) = meta.parts_count
    {
        out.object_parts = Some(parts_page(meta, count, input)?);
    }
    Ok(out)
}

fn parts_page(
    meta: &ObjectMeta,
    count: u32,
    input: &GetObjectAttributesInput,
) -> S3Result<GetObjectAttributesParts> {
    let max = match input.max_parts {
        None => 1000,
        Some(n) if n < 0 => {
            return Err(s3_error!(InvalidArgument, "max-parts must be non-negative"));
        }
        Some(n) => usize::try_from(n).unwrap_or(0).min(1000),
    };
    let marker = match input.part_number_marker {
        None => 0,
        Some(n) => usize::try_from(n)
            .map_err(|_| s3_error!(InvalidArgument, "part-number-marker must be non-negative"))?,
    };
    let algorithm: Option<Algorithm> = meta.checksum.as_ref().map(|c| c.algorithm);
    let rest = meta.parts.iter().enumerate().skip(marker);
    let total_listed = meta.parts.len().saturating_sub(marker);
    let truncated = total_listed > max;
    let parts: Vec<ObjectPart> = rest
        .take(max)
        .map(|(i, p)| {
            let mut part = ObjectPart {
                part_number: Some(i32::try_from(i + 1).unwrap_or(i32::MAX)),
                size: Some(i64::try_from(p.size).unwrap_or(i64::MAX)),
                ..Default::default()
            };
            if let (Some(a), Some(v)) = (algorithm, &p.checksum) {
                let c = StoredChecksum {
                    algorithm: a,
                    checksum_type: ChecksumType::FullObject,
                    value: v.clone(),
                };
                set_checksum!(part, c.to_dto());
            }
            part
        })
        .collect();
    let next = parts
        .last()
        .and_then(|p| p.part_number)
        .filter(|_| truncated);
    Ok(GetObjectAttributesParts {
        total_parts_count: Some(i32::try_from(count).unwrap_or(i32::MAX)),
        part_number_marker: Some(i32::try_from(marker).unwrap_or(i32::MAX)),
        next_part_number_marker: next,
        max_parts: Some(i32::try_from(max).unwrap_or(1000)),
        is_truncated: Some(truncated),
        parts: (!parts.is_empty()).then_some(parts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::PartMeta;
    use s3s::dto::ObjectAttributes;

    fn input(attrs: &[&'static str]) -> GetObjectAttributesInput {
        GetObjectAttributesInput {
            bucket: "b".into(),
            key: "k".into(),
            object_attributes: attrs
                .iter()
                .map(|a| ObjectAttributes::from_static(a))
                .collect(),
            expected_bucket_owner: None,
            max_parts: None,
            part_number_marker: None,
            request_payer: None,
            sse_customer_algorithm: None,
            sse_customer_key: None,
            sse_customer_key_md5: None,
            version_id: None,
        }
    }

    fn multipart() -> ObjectMeta {
        ObjectMeta {
            key: "k".into(),
            size: 12,
            etag: "abc-3".into(),
            parts_count: Some(3),
            checksum: Some(StoredChecksum {
                algorithm: Algorithm::Crc32,
                checksum_type: ChecksumType::Composite,
                value: "AAAAAA==-3".into(),
            }),
            parts: (0..3)
                .map(|i| PartMeta {
                    size: 4,
                    checksum: Some(format!("AAAAA{i}==")),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn names() {
        assert_eq!(
            Wanted::parse(["ETag,ObjectSize", "Checksum"]).unwrap(),
            Wanted {
                etag: true,
                checksum: true,
                size: true,
                ..Default::default()
            }
        );
        assert!(Wanted::parse(["ETag, Bogus"]).is_err());
        assert!(Wanted::parse(["etag"]).is_err());
    }

    #[test]
    fn only_what_was_asked() {
        let m = multipart();
        let out = get_object_attributes(
            &m,
            &input(&["ObjectSize"]),
            Timestamp::from(time::OffsetDateTime::UNIX_EPOCH),
        )
        .unwrap();
        assert_eq!(out.object_size, Some(12));
        assert!(out.e_tag.is_none() && out.checksum.is_none() && out.object_parts.is_none());
        let out = get_object_attributes(
            &m,
            &input(&["ETag,Checksum,ObjectParts,StorageClass"]),
            Timestamp::from(time::OffsetDateTime::UNIX_EPOCH),
        )
        .unwrap();
        assert_eq!(out.e_tag.unwrap().value(), "abc-3");
        let c = out.checksum.unwrap();
        // The composite value with its "-3", as Complete and HeadObject.
        assert_eq!(c.checksum_crc32.as_deref(), Some("AAAAAA==-3"));
        assert_eq!(c.checksum_type.unwrap().as_str(), "COMPOSITE");
        let p = out.object_parts.unwrap();
        assert_eq!(p.total_parts_count, Some(3));
        assert_eq!(p.is_truncated, Some(false));
        let parts = p.parts.unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2].part_number, Some(3));
        assert_eq!(parts[2].checksum_crc32.as_deref(), Some("AAAAA2=="));
        assert_eq!(parts[2].size, Some(4));
        // A single-part object has no ObjectParts.
        let single = ObjectMeta {
            size: 1,
            ..Default::default()
        };
        let out = get_object_attributes(
            &single,
            &input(&["ObjectParts", "Checksum"]),
            Timestamp::from(time::OffsetDateTime::UNIX_EPOCH),
        )
        .unwrap();
        assert!(out.object_parts.is_none() && out.checksum.is_none());
    }

    #[test]
    fn paging() {
        let m = multipart();
        let mut i = input(&["ObjectParts"]);
        i.max_parts = Some(2);
        let t = Timestamp::from(time::OffsetDateTime::UNIX_EPOCH);
        let p = get_object_attributes(&m, &i, t.clone())
            .unwrap()
            .object_parts
            .unwrap();
        assert_eq!(p.is_truncated, Some(true));
        assert_eq!(p.next_part_number_marker, Some(2));
        assert_eq!(p.parts.unwrap().len(), 2);
        i.part_number_marker = Some(2);
        let p = get_object_attributes(&m, &i, t.clone())
            .unwrap()
            .object_parts
            .unwrap();
        assert_eq!(p.is_truncated, Some(false));
        assert_eq!(p.next_part_number_marker, None);
        let parts = p.parts.unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].part_number, Some(3));
        i.max_parts = Some(-1);
        assert!(get_object_attributes(&m, &i, t).is_err());
    }
}
