//! Owners and ACLs: object-level access checks, the ACL a write asks for,
//! the ACL documents, and the ACL calls (Get/PutBucketAcl,
//! Get/PutObjectAcl).

use s3s::dto::Permission as Permission_;
use s3s::dto::*;
use s3s::{S3Error, S3Request, S3Response, S3Result, s3_error};

use super::S3Api;
use super::dto::check_version_id;
use super::error::{access_denied, acl_error, store_error};
use crate::acl::{self, Acl, AclError, GrantHeaders, Permission, PolicyGrant};
use crate::config::User;
use crate::store::{
    BucketInfo, ObjectAttrs, ObjectMeta, ObjectReader, StoreError, format::new_instance,
};

/// Object-level checks, and the ACLs writes ask for and documents show.
impl S3Api {
    /// A failed open: a missing key is NoSuchKey only to callers who may
    /// list the bucket, AccessDenied to others (as AWS answers).
    pub(super) fn open_error(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        e: StoreError,
    ) -> S3Error {
        if matches!(e, StoreError::NoSuchKey)
            && !self.users.bucket_allows(caller, info, Permission::Read)
        {
            return access_denied();
        }
        store_error(e)
    }

    /// Opens an object of the bucket `info` the caller needs `need` on.
    pub(super) async fn open_checked(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        key: &str,
        need: Permission,
    ) -> S3Result<ObjectReader> {
        let reader = self
            .store
            .open_object(&info.name, key)
            .await
            .map_err(|e| self.open_error(caller, info, e))?;
        self.check_object(caller, info, &reader.meta, need).await?;
        Ok(reader)
    }

    /// Opens `key` of `bucket` for a request by `caller` that needs `need`
    /// on it (the bucket's metadata as the access check read it, in
    /// `checked`), and whose `version_id` is none or `null`.
    pub(super) async fn open_for(
        &self,
        checked: &http::Extensions,
        caller: Option<&User>,
        (bucket, key, version_id): (&str, &str, Option<&str>),
        need: Permission,
    ) -> S3Result<ObjectReader> {
        check_version_id(version_id)?;
        let info = self.bucket_info(checked, bucket)?;
        self.open_checked(caller, &info, key, need).await
    }

    /// The ACL in force on an object instance: PutObjectAcl's, else the one
    /// it was written with.
    pub(super) async fn object_acl(&self, bucket: &str, meta: &ObjectMeta) -> S3Result<Acl> {
        Ok(
            match self
                .store
                .object_acl_override(bucket, meta)
                .await
                .map_err(store_error)?
            {
                Some(acl) => acl,
                None => meta.attrs.acl.clone().unwrap_or_default(),
            },
        )
    }

    pub(super) async fn check_object(
        &self,
        caller: Option<&User>,
        info: &BucketInfo,
        meta: &ObjectMeta,
        need: Permission,
    ) -> S3Result<()> {
        let owner = meta.attrs.owner.as_deref();
        // Operator grants and ownership need no ACL read.
        if self
            .users
            .object_allows(caller, info, owner, &Acl::default(), need)
        {
            return Ok(());
        }
        let acl = self.object_acl(&info.name, meta).await?;
        if self.users.object_allows(caller, info, owner, &acl, need) {
            Ok(())
        } else {
            Err(access_denied())
        }
    }

    /// The ACL `x-amz-acl` / `x-amz-grant-*` ask for on a new bucket or
    /// object (`None`: private).
    pub(super) fn requested_acl(
        &self,
        owner: &str,
        bucket_owner: &str,
        canned: Option<&str>,
        grants: &GrantHeaders<'_>,
    ) -> S3Result<Option<Acl>> {
        acl::from_headers(canned, grants, owner, bucket_owner, &|id| {
            self.users.known_id(id)
        })
        .map_err(acl_error)
    }

    /// Owner, ACL and instance of an object `caller` writes into the bucket
    /// `info`.
    pub(super) fn stamp(
        &self,
        attrs: &mut ObjectAttrs,
        caller: Option<&User>,
        info: &BucketInfo,
        canned: Option<&str>,
        grants: &GrantHeaders<'_>,
    ) -> S3Result<()> {
        let bucket_owner = self.users.bucket_owner(info);
        // Anonymous writes (a public-read-write bucket) belong to the bucket owner.
        let owner = caller.map_or_else(|| bucket_owner.clone(), |u| u.canonical_id.clone());
        attrs.acl = self.requested_acl(&owner, &bucket_owner, canned, grants)?;
        attrs.owner = Some(owner);
        attrs.instance = Some(new_instance());
        Ok(())
    }

    /// The new ACL of a PutBucketAcl/PutObjectAcl: a canned ACL, grant
    /// headers, or an `AccessControlPolicy` body (exactly one).
    pub(super) fn acl_to_set(
        &self,
        owner: &str,
        bucket_owner: &str,
        canned: Option<&str>,
        grants: &GrantHeaders<'_>,
        policy: Option<&AccessControlPolicy>,
    ) -> S3Result<Acl> {
        let known = |id: &str| self.users.known_id(id);
        match policy {
            Some(p) => {
                if canned.is_some() || grants != &GrantHeaders::default() {
                    return Err(acl_error(AclError::CannedAndGrants));
                }
                let list: Vec<PolicyGrant<'_>> = p
                    .grants
                    .iter()
                    .flatten()
                    .map(|g| PolicyGrant {
                        id: g.grantee.as_ref().and_then(|e| e.id.as_deref()),
                        uri: g.grantee.as_ref().and_then(|e| e.uri.as_deref()),
                        email: g.grantee.as_ref().and_then(|e| e.email_address.as_deref()),
                        permission: g.permission.as_ref().map(Permission_::as_str),
                    })
                    .collect();
                let policy_owner = p.owner.as_ref().and_then(|o| o.id.as_deref());
                acl::from_policy(policy_owner, &list, owner, &known).map_err(acl_error)
            }
            None => {
                match acl::from_headers(canned, grants, owner, bucket_owner, &known)
                    .map_err(acl_error)?
                {
                    Some(acl) => Ok(acl),
                    None => Err(s3_error!(
                        MissingSecurityHeader,
                        "Your request was missing a required header: x-amz-acl, an x-amz-grant-* header or an AccessControlPolicy body"
                    )),
                }
            }
        }
    }

    /// The `Owner` element for a canonical id.
    pub(super) fn owner_of(&self, id: &str) -> Owner {
        Owner {
            display_name: Some(self.users.display_name(id)),
            id: Some(id.to_owned()),
        }
    }

    /// The `Owner`/`Initiator` element for the user with an access key.
    pub(super) fn owner_of_key(&self, access_key: &str) -> Owner {
        match self.users.get(access_key) {
            Some(u) => self.owner_of(&u.canonical_id),
            None => self.owner_of(&crate::config::default_canonical_id(access_key)),
        }
    }

    /// The grants of an ACL document, the owner's full control first.
    pub(super) fn grants_of(&self, owner: &str, acl: &Acl) -> Grants {
        acl.shown(owner)
            .into_iter()
            .map(|g| {
                let grantee = match &g.grantee {
                    acl::Grantee::User(id) => Grantee {
                        display_name: Some(self.users.display_name(id)),
                        email_address: None,
                        id: Some(id.clone()),
                        type_: Type::from_static(Type::CANONICAL_USER),
                        uri: None,
                    },
                    group => Grantee {
                        display_name: None,
                        email_address: None,
                        id: None,
                        type_: Type::from_static(Type::GROUP),
                        uri: group.uri().map(str::to_owned),
                    },
                };
                Grant {
                    grantee: Some(grantee),
                    permission: Some(Permission_::from(g.permission.as_str().to_owned())),
                }
            })
            .collect()
    }
}

pub(super) async fn get_bucket_acl(
    s3: &S3Api,
    req: S3Request<GetBucketAclInput>,
) -> S3Result<S3Response<GetBucketAclOutput>> {
    let info = s3.bucket_info(&req.extensions, &req.input.bucket)?;
    let owner = s3.users.bucket_owner(&info);
    Ok(S3Response::new(GetBucketAclOutput {
        grants: Some(s3.grants_of(&owner, &info.acl)),
        owner: Some(s3.owner_of(&owner)),
    }))
}

pub(super) async fn put_bucket_acl(
    s3: &S3Api,
    req: S3Request<PutBucketAclInput>,
) -> S3Result<S3Response<PutBucketAclOutput>> {
    let input = req.input;
    let info = s3.bucket_info(&req.extensions, &input.bucket)?;
    let owner = s3.users.bucket_owner(&info);
    let acl = s3.acl_to_set(
        &owner,
        &owner,
        input.acl.as_ref().map(BucketCannedACL::as_str),
        &grant_headers!(input, grant_write),
        input.access_control_policy.as_ref(),
    )?;
    s3.store
        .set_bucket_acl(&input.bucket, acl)
        .await
        .map_err(store_error)?;
    Ok(S3Response::new(PutBucketAclOutput {}))
}

pub(super) async fn get_object_acl(
    s3: &S3Api,
    req: S3Request<GetObjectAclInput>,
) -> S3Result<S3Response<GetObjectAclOutput>> {
    open_input!(s3, req, Permission::ReadAcp => caller, input, reader);
    let info = s3.bucket_info(&req.extensions, &input.bucket)?;
    let owner = reader
        .meta
        .attrs
        .owner
        .clone()
        .unwrap_or_else(|| s3.users.bucket_owner(&info));
    let acl = s3.object_acl(&input.bucket, &reader.meta).await?;
    Ok(S3Response::new(GetObjectAclOutput {
        grants: Some(s3.grants_of(&owner, &acl)),
        owner: Some(s3.owner_of(&owner)),
        request_charged: None,
    }))
}

pub(super) async fn put_object_acl(
    s3: &S3Api,
    req: S3Request<PutObjectAclInput>,
) -> S3Result<S3Response<PutObjectAclOutput>> {
    open_input!(s3, req, Permission::WriteAcp => caller, input, reader);
    let info = s3.bucket_info(&req.extensions, &input.bucket)?;
    let bucket_owner = s3.users.bucket_owner(&info);
    let owner = reader
        .meta
        .attrs
        .owner
        .clone()
        .unwrap_or_else(|| bucket_owner.clone());
    let acl = s3.acl_to_set(
        &owner,
        &bucket_owner,
        input.acl.as_ref().map(ObjectCannedACL::as_str),
        &grant_headers!(input, grant_write),
        input.access_control_policy.as_ref(),
    )?;
    s3.store
        .set_object_acl(&input.bucket, &reader.meta, acl)
        .await
        .map_err(store_error)?;
    Ok(S3Response::new(PutObjectAclOutput::default()))
}
