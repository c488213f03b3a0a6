//! Access control lists: the model stored with buckets and objects, canned
//! ACLs, the `x-amz-grant-*` header grammar, the `AccessControlPolicy` body,
//! and the evaluation rule. Pure logic, no I/O.
//!
//! The rule (AWS's, for buckets and objects alike): the owner may do
//! everything; anyone else needs a grant of the permission (or
//! `FULL_CONTROL`) to their canonical id, to `AuthenticatedUsers` (any
//! configured user) or to `AllUsers` (anyone, including anonymous callers).
//! The operator's bucket grants from the configuration are an extra
//! permission on top, applied by [`crate::auth`].

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The `AllUsers` group URI (anyone, signed or not).
pub const ALL_USERS_URI: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
/// The `AuthenticatedUsers` group URI (any user of this server).
pub const AUTHENTICATED_USERS_URI: &str =
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";
/// The `LogDelivery` group URI (accepted and shown; nothing here acts as it).
pub const LOG_DELIVERY_URI: &str = "http://acs.amazonaws.com/groups/s3/LogDelivery";

/// Most grants one ACL may hold (AWS's limit).
pub const MAX_GRANTS: usize = 100;

/// An ACL permission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Permission {
    /// Buckets: list. Objects: read data and metadata.
    Read,
    /// Buckets: create, overwrite and delete objects.
    Write,
    /// Read the ACL.
    ReadAcp,
    /// Replace the ACL.
    WriteAcp,
    /// All of the above.
    FullControl,
}

impl Permission {
    /// The S3 name (`READ`, `WRITE`, `READ_ACP`, `WRITE_ACP`, `FULL_CONTROL`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "READ",
            Permission::Write => "WRITE",
            Permission::ReadAcp => "READ_ACP",
            Permission::WriteAcp => "WRITE_ACP",
            Permission::FullControl => "FULL_CONTROL",
        }
    }

    /// Parses an S3 permission name.
    #[must_use]
    pub fn parse(s: &str) -> Option<Permission> {
        Some(match s {
            "READ" => Permission::Read,
            "WRITE" => Permission::Write,
            "READ_ACP" => Permission::ReadAcp,
            "WRITE_ACP" => Permission::WriteAcp,
            "FULL_CONTROL" => Permission::FullControl,
            _ => return None,
        })
    }

    /// Whether holding `self` gives `need`.
    #[must_use]
    pub fn covers(self, need: Permission) -> bool {
        self == Permission::FullControl || self == need
    }
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grantee {
    /// A user, by canonical id.
    User(String),
    /// Everyone, including anonymous callers.
    AllUsers,
    /// Every configured user.
    AuthenticatedUsers,
    /// The log-delivery group (no caller here belongs to it).
    LogDelivery,
}

impl Grantee {
    /// The group URI, for groups.
    #[must_use]
    pub fn uri(&self) -> Option<&'static str> {
        match self {
            Grantee::User(_) => None,
            Grantee::AllUsers => Some(ALL_USERS_URI),
            Grantee::AuthenticatedUsers => Some(AUTHENTICATED_USERS_URI),
            Grantee::LogDelivery => Some(LOG_DELIVERY_URI),
        }
    }

    fn from_uri(uri: &str) -> Option<Grantee> {
        match uri {
            ALL_USERS_URI => Some(Grantee::AllUsers),
            AUTHENTICATED_USERS_URI => Some(Grantee::AuthenticatedUsers),
            LOG_DELIVERY_URI => Some(Grantee::LogDelivery),
            _ => None,
        }
    }
}

/// One grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// Who.
    pub grantee: Grantee,
    /// What.
    pub permission: Permission,
}

/// The grants of a bucket or object, as set (a canned ACL includes the
/// owner's `FULL_CONTROL`, as in AWS); the owner, stored beside it, may do
/// everything whatever the grants say. Empty means private.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    /// The grants.
    #[serde(default)]
    pub grants: Vec<Grant>,
}

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller<'a> {
    /// An unsigned request.
    Anonymous,
    /// A configured user, by canonical id.
    User(&'a str),
}

impl Acl {
    /// Whether the ACL gives `caller` the permission `need` on a resource
    /// owned by `owner` (the owner always may).
    #[must_use]
    pub fn allows(&self, owner: &str, caller: Caller<'_>, need: Permission) -> bool {
        if let Caller::User(id) = caller
            && id == owner
        {
            return true;
        }
        self.grants.iter().any(|g| {
            g.permission.covers(need)
                && match (&g.grantee, caller) {
                    (Grantee::AllUsers, _) => true,
                    (Grantee::AuthenticatedUsers, Caller::User(_)) => true,
                    (Grantee::User(g), Caller::User(id)) => g == id,
                    _ => false,
                }
        })
    }

    /// The grants as GetBucketAcl/GetObjectAcl show them: as set; an empty
    /// (private) ACL shows the owner's `FULL_CONTROL`.
    #[must_use]
    pub fn shown(&self, owner: &str) -> Vec<Grant> {
        if self.grants.is_empty() {
            return vec![Grant {
                grantee: Grantee::User(owner.to_owned()),
                permission: Permission::FullControl,
            }];
        }
        self.grants.clone()
    }
}

/// A canned ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Canned {
    /// Owner only.
    Private,
    /// `AllUsers` READ.
    PublicRead,
    /// `AllUsers` READ and WRITE.
    PublicReadWrite,
    /// `AuthenticatedUsers` READ.
    AuthenticatedRead,
    /// Objects: the bucket owner READ.
    BucketOwnerRead,
    /// Objects: the bucket owner FULL_CONTROL.
    BucketOwnerFullControl,
    /// `LogDelivery` WRITE and READ_ACP.
    LogDeliveryWrite,
    /// Owner only here (EC2's read grant has no meaning on this server).
    AwsExecRead,
}

impl Canned {
    /// Parses an `x-amz-acl` value.
    ///
    /// # Errors
    /// [`AclError::BadCanned`] for anything else.
    pub fn parse(s: &str) -> Result<Canned, AclError> {
        Ok(match s {
            "private" => Canned::Private,
            "public-read" => Canned::PublicRead,
            "public-read-write" => Canned::PublicReadWrite,
            "authenticated-read" => Canned::AuthenticatedRead,
            "bucket-owner-read" => Canned::BucketOwnerRead,
            "bucket-owner-full-control" => Canned::BucketOwnerFullControl,
            "log-delivery-write" => Canned::LogDeliveryWrite,
            "aws-exec-read" => Canned::AwsExecRead,
            _ => return Err(AclError::BadCanned(s.to_owned())),
        })
    }

    /// The grants it stands for on a resource of `owner`: the owner's
    /// `FULL_CONTROL` and the canned grants; `bucket_owner` is the canonical
    /// id of the bucket's owner (for the `bucket-owner-*` ACLs).
    #[must_use]
    pub fn acl(self, owner: &str, bucket_owner: &str) -> Acl {
        let g = |grantee: Grantee, permission: Permission| Grant {
            grantee,
            permission,
        };
        let mut grants = vec![g(Grantee::User(owner.to_owned()), Permission::FullControl)];
        grants.extend(match self {
            Canned::Private | Canned::AwsExecRead => vec![],
            Canned::PublicRead => vec![g(Grantee::AllUsers, Permission::Read)],
            Canned::PublicReadWrite => vec![
                g(Grantee::AllUsers, Permission::Read),
                g(Grantee::AllUsers, Permission::Write),
            ],
            Canned::AuthenticatedRead => vec![g(Grantee::AuthenticatedUsers, Permission::Read)],
            Canned::BucketOwnerRead => {
                vec![g(Grantee::User(bucket_owner.to_owned()), Permission::Read)]
            }
            Canned::BucketOwnerFullControl => vec![g(
                Grantee::User(bucket_owner.to_owned()),
                Permission::FullControl,
            )],
            Canned::LogDeliveryWrite => vec![
                g(Grantee::LogDelivery, Permission::Write),
                g(Grantee::LogDelivery, Permission::ReadAcp),
            ],
        });
        // bucket-owner-* on the bucket owner's own object: one grant.
        grants.dedup();
        Acl { grants }
    }
}

/// Why an ACL in a request is refused. Each maps to the S3 error AWS sends.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AclError {
    /// An unknown canned ACL (400 InvalidArgument).
    #[error(
        "the canned ACL {0:?} is not one of private, public-read, public-read-write, authenticated-read, bucket-owner-read, bucket-owner-full-control, log-delivery-write, aws-exec-read"
    )]
    BadCanned(String),
    /// A canned ACL together with grant headers or a policy (400 InvalidRequest).
    #[error("Specifying both Canned ACLs and Header Grants is not allowed")]
    CannedAndGrants,
    /// A malformed grant header or grantee (400 InvalidArgument).
    #[error("invalid grant: {0}")]
    BadGrant(String),
    /// A grantee by e-mail address (400 UnresolvableGrantByEmailAddress).
    #[error("The e-mail address you provided does not match any account on record.")]
    Email,
    /// A canonical id no configured user has (400 InvalidArgument).
    #[error("Invalid id: {0}")]
    UnknownId(String),
    /// More than [`MAX_GRANTS`] grants (400 MalformedACLError).
    #[error("an ACL may hold at most {MAX_GRANTS} grants")]
    TooManyGrants,
    /// The policy names another owner (403 AccessDenied, as AWS).
    #[error("the ACL's Owner is not the resource's owner")]
    WrongOwner,
}

impl AclError {
    /// The S3 error code and HTTP status AWS answers with.
    #[must_use]
    pub fn code(&self) -> (&'static str, u16) {
        match self {
            AclError::BadCanned(_) | AclError::BadGrant(_) | AclError::UnknownId(_) => {
                ("InvalidArgument", 400)
            }
            AclError::CannedAndGrants => ("InvalidRequest", 400),
            AclError::Email => ("UnresolvableGrantByEmailAddress", 400),
            AclError::TooManyGrants => ("MalformedACLError", 400),
            AclError::WrongOwner => ("AccessDenied", 403),
        }
    }
}

/// The `x-amz-grant-*` headers of a request, as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantHeaders<'a> {
    /// `x-amz-grant-read`.
    pub read: Option<&'a str>,
    /// `x-amz-grant-write`.
    pub write: Option<&'a str>,
    /// `x-amz-grant-read-acp`.
    pub read_acp: Option<&'a str>,
    /// `x-amz-grant-write-acp`.
    pub write_acp: Option<&'a str>,
    /// `x-amz-grant-full-control`.
    pub full_control: Option<&'a str>,
}

impl GrantHeaders<'_> {
    fn is_empty(&self) -> bool {
        self.read.is_none()
            && self.write.is_none()
            && self.read_acp.is_none()
            && self.write_acp.is_none()
            && self.full_control.is_none()
    }
}

/// Parses one grant header value: comma-separated `id="…"`, `uri="…"` or
/// `emailAddress="…"` items (quotes optional).
///
/// # Errors
/// [`AclError::BadGrant`], [`AclError::Email`], [`AclError::UnknownId`].
pub fn parse_grantees(
    value: &str,
    known_id: &dyn Fn(&str) -> bool,
) -> Result<Vec<Grantee>, AclError> {
    let mut out = Vec::new();
    for item in value.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (kind, v) = item
            .split_once('=')
            .ok_or_else(|| AclError::BadGrant(item.to_owned()))?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        match kind.trim().to_ascii_lowercase().as_str() {
            "id" => {
                if !known_id(v) {
                    return Err(AclError::UnknownId(v.to_owned()));
                }
                out.push(Grantee::User(v.to_owned()));
            }
            "uri" => out.push(
                Grantee::from_uri(v)
                    .ok_or_else(|| AclError::BadGrant(format!("unknown group {v}")))?,
            ),
            "emailaddress" => return Err(AclError::Email),
            _ => return Err(AclError::BadGrant(item.to_owned())),
        }
    }
    if out.is_empty() {
        return Err(AclError::BadGrant(value.to_owned()));
    }
    Ok(out)
}

/// The ACL a request asks for with `x-amz-acl` or `x-amz-grant-*` headers;
/// `None` when it sends neither.
///
/// # Errors
/// See [`AclError`].
pub fn from_headers(
    canned: Option<&str>,
    grants: &GrantHeaders<'_>,
    owner: &str,
    bucket_owner: &str,
    known_id: &dyn Fn(&str) -> bool,
) -> Result<Option<Acl>, AclError> {
    match (canned, grants.is_empty()) {
        (Some(_), false) => Err(AclError::CannedAndGrants),
        (Some(c), true) => Ok(Some(Canned::parse(c)?.acl(owner, bucket_owner))),
        (None, true) => Ok(None),
        (None, false) => {
            let mut acl = Acl::default();
            for (value, permission) in [
                (grants.full_control, Permission::FullControl),
                (grants.read, Permission::Read),
                (grants.write, Permission::Write),
                (grants.read_acp, Permission::ReadAcp),
                (grants.write_acp, Permission::WriteAcp),
            ] {
                if let Some(v) = value {
                    for grantee in parse_grantees(v, known_id)? {
                        acl.grants.push(Grant {
                            grantee,
                            permission,
                        });
                    }
                }
            }
            if acl.grants.len() > MAX_GRANTS {
                return Err(AclError::TooManyGrants);
            }
            Ok(Some(acl))
        }
    }
}

/// One grant of an `AccessControlPolicy` body, as parsed by s3s.
#[derive(Debug, Clone, Default)]
pub struct PolicyGrant<'a> {
    /// `Grantee/ID`.
    pub id: Option<&'a str>,
    /// `Grantee/URI`.
    pub uri: Option<&'a str>,
    /// `Grantee/EmailAddress`.
    pub email: Option<&'a str>,
    /// `Permission`.
    pub permission: Option<&'a str>,
}

/// The ACL of an `AccessControlPolicy` body. `policy_owner` is its
/// `Owner/ID` (when given it must be `owner`).
///
/// # Errors
/// See [`AclError`].
pub fn from_policy(
    policy_owner: Option<&str>,
    grants: &[PolicyGrant<'_>],
    owner: &str,
    known_id: &dyn Fn(&str) -> bool,
) -> Result<Acl, AclError> {
    if let Some(o) = policy_owner
        && o != owner
    {
        return Err(AclError::WrongOwner);
    }
    if grants.len() > MAX_GRANTS {
        return Err(AclError::TooManyGrants);
    }
    let mut acl = Acl::default();
    for g in grants {
        let permission = g
            .permission
            .and_then(Permission::parse)
            .ok_or_else(|| AclError::BadGrant(format!("permission {:?}", g.permission)))?;
        let grantee = match (g.id, g.uri, g.email) {
            (_, _, Some(_)) => return Err(AclError::Email),
            (Some(id), None, None) => {
                if !known_id(id) {
                    return Err(AclError::UnknownId(id.to_owned()));
                }
                Grantee::User(id.to_owned())
            }
            (None, Some(uri), None) => Grantee::from_uri(uri)
                .ok_or_else(|| AclError::BadGrant(format!("unknown group {uri}")))?,
            _ => {
                return Err(AclError::BadGrant(
                    "a grantee needs exactly one of ID and URI".into(),
                ));
            }
        };
        acl.grants.push(Grant {
            grantee,
            permission,
        });
    }
    Ok(acl)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaa";
    const B: &str = "bbbb";

    fn known(id: &str) -> bool {
        id == A || id == B
    }

    #[test]
    fn owner_and_groups() {
        let private = Acl::default();
        assert!(private.allows(A, Caller::User(A), Permission::WriteAcp));
        assert!(!private.allows(A, Caller::User(B), Permission::Read));
        assert!(!private.allows(A, Caller::Anonymous, Permission::Read));
        let public = Canned::PublicRead.acl(A, A);
        assert!(public.allows(A, Caller::Anonymous, Permission::Read));
        assert!(!public.allows(A, Caller::Anonymous, Permission::Write));
        assert!(!public.allows(A, Caller::User(B), Permission::ReadAcp));
        let auth = Canned::AuthenticatedRead.acl(A, A);
        assert!(auth.allows(A, Caller::User(B), Permission::Read));
        assert!(!auth.allows(A, Caller::Anonymous, Permission::Read));
        let bofc = Canned::BucketOwnerFullControl.acl(A, B);
        assert!(bofc.allows(A, Caller::User(B), Permission::WriteAcp));
        let bor = Canned::BucketOwnerRead.acl(A, B);
        assert!(bor.allows(A, Caller::User(B), Permission::Read));
        assert!(!bor.allows(A, Caller::User(B), Permission::ReadAcp));
        let prw = Canned::PublicReadWrite.acl(A, A);
        assert!(prw.allows(A, Caller::Anonymous, Permission::Write));
    }

    #[test]
    fn headers() {
        let g = GrantHeaders {
            read: Some(&format!("id=\"{B}\", uri=\"{ALL_USERS_URI}\"")),
            write_acp: Some(&format!("id={B}")),
            ..Default::default()
        };
        let acl = from_headers(None, &g, A, A, &known).unwrap().unwrap();
        assert_eq!(acl.grants.len(), 3);
        assert!(acl.allows(A, Caller::Anonymous, Permission::Read));
        assert!(acl.allows(A, Caller::User(B), Permission::WriteAcp));
        assert!(!acl.allows(A, Caller::User(B), Permission::Write));
        assert_eq!(
            from_headers(None, &GrantHeaders::default(), A, A, &known),
            Ok(None)
        );
        assert_eq!(
            from_headers(Some("private"), &g, A, A, &known),
            Err(AclError::CannedAndGrants)
        );
        assert!(matches!(
            from_headers(Some("nope"), &GrantHeaders::default(), A, A, &known),
            Err(AclError::BadCanned(_))
        ));
        let unknown = GrantHeaders {
            read: Some("id=\"cccc\""),
            ..Default::default()
        };
        assert_eq!(
            from_headers(None, &unknown, A, A, &known),
            Err(AclError::UnknownId("cccc".into()))
        );
        let email = GrantHeaders {
            read: Some("emailAddress=\"x@example.com\""),
            ..Default::default()
        };
        assert_eq!(
            from_headers(None, &email, A, A, &known),
            Err(AclError::Email)
        );
        for bad in ["", "id", "foo=bar", "uri=\"http://example.com/g\""] {
            let h = GrantHeaders {
                read: Some(bad),
                ..Default::default()
            };
            assert!(from_headers(None, &h, A, A, &known).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn policy() {
        let grants = [
            PolicyGrant {
                id: Some(A),
                permission: Some("FULL_CONTROL"),
                ..Default::default()
            },
            PolicyGrant {
                uri: Some(AUTHENTICATED_USERS_URI),
                permission: Some("READ"),
                ..Default::default()
            },
        ];
        let acl = from_policy(Some(A), &grants, A, &known).unwrap();
        assert_eq!(acl.shown(A), acl.grants, "shown as set");
        assert_eq!(Acl::default().shown(A).len(), 1, "private shows the owner");
        assert_eq!(
            from_policy(Some(B), &grants, A, &known),
            Err(AclError::WrongOwner)
        );
        let bad = [PolicyGrant {
            id: Some(B),
            permission: Some("ALL"),
            ..Default::default()
        }];
        assert!(from_policy(None, &bad, A, &known).is_err());
    }

    #[test]
    fn serde_round_trip() {
        let acl = Canned::PublicReadWrite.acl(A, A);
        let json = serde_json::to_string(&acl).unwrap();
        assert_eq!(serde_json::from_str::<Acl>(&json).unwrap(), acl);
        assert!(json.contains("all_users"), "{json}");
    }
}
