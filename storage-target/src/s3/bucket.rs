//! Bucket calls: CreateBucket, HeadBucket, DeleteBucket, ListBuckets,
//! GetBucketLocation.

use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use super::S3Api;
use super::dto::{access_key, ts};
use super::error::{WithStatus as _, access_denied, store_error};

/// The region where re-creating one's own bucket succeeds.
const LEGACY_REGION: &str = "us-east-1";

pub(super) async fn create_bucket(
    s3: &S3Api,
    req: S3Request<CreateBucketInput>,
) -> S3Result<S3Response<CreateBucketOutput>> {
    let who = access_key(&req);
    let caller = s3.caller(&req).ok_or_else(access_denied)?;
    let input = req.input;
    if let Some(c) = input
        .create_bucket_configuration
        .as_ref()
        .and_then(|c| c.location_constraint.as_ref())
    {
        let c = c.as_str();
        if !c.is_empty() && c != s3.region {
            return Err(S3Error::with_message(
                S3ErrorCode::Custom("InvalidLocationConstraint".into()),
                format!(
                    "The specified location-constraint is not valid: this server's region is {}",
                    s3.region
                ),
            )
            .with_status(http::StatusCode::BAD_REQUEST));
        }
    }
    let acl = s3
        .requested_acl(
            &caller.canonical_id,
            &caller.canonical_id,
            input.acl.as_ref().map(BucketCannedACL::as_str),
            &grant_headers!(input, grant_write),
        )?
        .unwrap_or_default();
    match s3
        .store
        .create_bucket(&input.bucket, &who, &caller.canonical_id, acl)
        .await
    {
        Ok(_) => {}
        // AWS's us-east-1 answers a caller re-creating its own bucket with
        // 200 and changes nothing (SDK code written against it relies on
        // that); every other region answers 409.
        Err(crate::store::StoreError::BucketAlreadyOwnedByYou) if s3.region == LEGACY_REGION => {}
        Err(e) => return Err(store_error(e)),
    }
    Ok(S3Response::new(CreateBucketOutput {
        location: Some(format!("/{}", input.bucket)),
    }))
}

pub(super) async fn head_bucket(
    s3: &S3Api,
    req: S3Request<HeadBucketInput>,
) -> S3Result<S3Response<HeadBucketOutput>> {
    s3.store
        .head_bucket(&req.input.bucket)
        .map_err(store_error)?;
    Ok(S3Response::new(HeadBucketOutput {
        bucket_region: Some(s3.region.clone()),
        ..Default::default()
    }))
}

pub(super) async fn delete_bucket(
    s3: &S3Api,
    req: S3Request<DeleteBucketInput>,
) -> S3Result<S3Response<DeleteBucketOutput>> {
    s3.store
        .delete_bucket(&req.input.bucket)
        .await
        .map_err(store_error)?;
    Ok(S3Response::new(DeleteBucketOutput {}))
}

pub(super) async fn list_buckets(
    s3: &S3Api,
    req: S3Request<ListBucketsInput>,
) -> S3Result<S3Response<ListBucketsOutput>> {
    let caller = s3.caller(&req).ok_or_else(access_denied)?;
    let buckets: Vec<Bucket> = s3
        .store
        .list_buckets()
        .into_iter()
        .filter(|b| s3.users.bucket_owner(b) == caller.canonical_id)
        .filter(|b| {
            req.input
                .prefix
                .as_ref()
                .is_none_or(|p| b.name.starts_with(p.as_str()))
        })
        .map(|b| Bucket {
            name: Some(b.name),
            creation_date: Some(ts(b.created_ms)),
            bucket_region: Some(s3.region.clone()),
        })
        .collect();
    Ok(S3Response::new(ListBucketsOutput {
        buckets: Some(buckets),
        owner: Some(s3.owner_of(&caller.canonical_id)),
        prefix: req.input.prefix,
        continuation_token: None,
    }))
}

pub(super) async fn get_bucket_location(
    s3: &S3Api,
    req: S3Request<GetBucketLocationInput>,
) -> S3Result<S3Response<GetBucketLocationOutput>> {
    s3.store
        .head_bucket(&req.input.bucket)
        .map_err(store_error)?;
    let location_constraint =
        (s3.region != "us-east-1").then(|| BucketLocationConstraint::from(s3.region.clone()));
    Ok(S3Response::new(GetBucketLocationOutput {
        location_constraint,
    }))
}
