//! The RDMA dialects this server speaks, and the one seam where a request's
//! dialect is decided.
//!
//! * [`s3dma`]: s3dma-v1, s3dma's own exchange (`x-amz-rdma-protocol:
//!   s3dma-v1`, the token names an s3dma fabric endpoint).
//! * [`cuobject_dc`]: cuObject's standard token (no marker), served over DC
//!   when this server's device does DC (`rdma.dc`, mlx5 only).
//! * [`hipobj`]: AMD's hipobj-rc-v2, which moves bytes through its own
//!   control requests (`/.hipobj-rc/`) rather than an object request's
//!   token: its route, service, sessions and fronts.
//! * [`s3dma_batch`]: s3dma batch requests (`POST /?s3dma-batch`): many
//!   HEADs, GETs and PUTs, each GET or PUT with its own window, as one
//!   signed request, beside the hipobj-rc-v2 route ([`s3dma_batch::Routes`]).
//!
//! [`decide`] is the seam for an object request (GetObject, PutObject,
//! UploadPart): the token header is read, its signing checked, the dialect
//! chosen from `x-amz-rdma-protocol`, the dialect's file says whether and how
//! it is served, and the allowed-client-networks rule
//! ([`ClientNetworks`], `rdma.allowed_client_networks`) is checked once for
//! whatever endpoint the dialect's token names. The data path
//! ([`crate::rdma`]) then moves the bytes as the [`Decision`] says, and asks
//! the dialect ([`Dialect::sessions`]) which sessions carry them.
//!
//! Only this module (and the configuration's parsing and validation)
//! matches on the dialect enums; everything else asks them through their
//! methods.

pub mod cuobject_dc;
pub mod hipobj;
pub mod s3dma;
pub mod s3dma_batch;

use std::net::IpAddr;
use std::sync::Arc;

use fabric::RdmaToken;
use fabric::pool::SessionPool;
use http::HeaderMap;
use s3dma_wire::headers::Dialect as Marker;
use tracing::{info, warn};

use crate::config::networks::{self, Cidr};
use crate::rdma::error::RdmaError;
use crate::rdma::headers::{self, RequestError, reply_headers};

/// The dialect an object request's bytes move in over RDMA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// s3dma-v1: s3dma's fabric session to the token's endpoint.
    S3dma,
    /// cuObject's standard token: this server's DC initiators to the
    /// token's DC target.
    CuobjectDc,
}

impl Dialect {
    /// The sessions that carry this dialect's bytes: s3dma's fabric
    /// sessions, or the DC sessions (`None` when this server has none).
    #[must_use]
    pub fn sessions<'a>(
        self,
        fabric: &'a Arc<SessionPool>,
        dc: Option<&'a Arc<SessionPool>>,
    ) -> Option<&'a Arc<SessionPool>> {
        match self {
            Dialect::S3dma => Some(fabric),
            Dialect::CuobjectDc => dc,
        }
    }

    /// Whether this dialect's bytes move over DC initiators: it is served
    /// from a rail whose device does DC.
    #[must_use]
    pub fn needs_dc(self) -> bool {
        matches!(self, Dialect::CuobjectDc)
    }
}

/// What to do with an object request.
#[derive(Debug, Clone)]
pub enum Decision {
    /// No token: plain HTTP.
    Http,
    /// A token this server will not serve: answer `x-amz-rdma-reply: 501`
    /// (a GET with the object in the body, a PUT storing nothing).
    Decline(Declined),
    /// Serve over RDMA in this dialect with this token.
    Serve(Dialect, RdmaToken),
}

/// How a [`Decision`] is served: over HTTP (no token), declined (why), or
/// over RDMA (the dialect and the token).
pub type Served<'a> = Result<Option<(Dialect, &'a RdmaToken)>, &'a Declined>;

impl Decision {
    /// The decision as [`Served`]: `Ok(None)` over HTTP, `Err(why)` declined,
    /// `Ok(Some((dialect, token)))` over RDMA.
    ///
    /// # Errors
    /// Why the request is declined.
    pub fn served(&self) -> Served<'_> {
        match self {
            Decision::Http => Ok(None),
            Decision::Decline(why) => Err(why),
            Decision::Serve(dialect, token) => Ok(Some((*dialect, token))),
        }
    }

    /// The token, when the request is served over RDMA.
    #[must_use]
    pub fn token(&self) -> Option<&RdmaToken> {
        self.served().ok().flatten().map(|(_, t)| t)
    }

    /// The dialect the bytes move in (s3dma's when not over RDMA).
    #[must_use]
    pub fn dialect(&self) -> Dialect {
        self.served()
            .ok()
            .flatten()
            .map_or(Dialect::S3dma, |(d, _)| d)
    }

    /// The reply headers of a GetObject: over RDMA `200`, or `206` for
    /// `partial` content, with the bytes `transferred`; `501` when declined
    /// (the object went in the HTTP body); none over HTTP.
    #[must_use]
    pub fn get_reply(&self, partial: bool, transferred: u64) -> HeaderMap {
        match self.served() {
            Ok(Some(_)) => reply_headers(if partial { 206 } else { 200 }, Some(transferred)),
            Err(_) => reply_headers(501, None),
            Ok(None) => HeaderMap::new(),
        }
    }
}

/// Why a tokened request is declined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declined {
    /// `rdma: disabled`, or the fabric could not be opened.
    Off,
    /// A standard token (no `x-amz-rdma-protocol`: the cuObject dialect,
    /// a DC target in the client's memory) or a raw hipobj-rc-v2 token on
    /// an object request: this server has no DC transport, and
    /// hipobj-rc-v2 clients use its `/.hipobj-rc/` control requests.
    StandardToken,
    /// `x-amz-rdma-protocol` names a dialect this server does not speak.
    Dialect,
}

impl Declined {
    /// Why, in the reply's words; `off` says why RDMA is off here.
    #[must_use]
    pub fn reason(&self, off: &'static str) -> &'static str {
        match self {
            Declined::Off => off,
            Declined::StandardToken => cuobject_dc::DECLINED,
            Declined::Dialect => "x-amz-rdma-protocol names a dialect this server does not speak",
        }
    }
}

/// `rdma.allowed_client_networks`: the only networks this server sends to
/// or reads from over RDMA, whatever a token or a queue pair names.
#[derive(Debug, Clone, Default)]
pub struct ClientNetworks(Vec<Cidr>);

impl ClientNetworks {
    /// The networks `cidrs` (none: nothing is allowed).
    #[must_use]
    pub fn new(cidrs: Vec<Cidr>) -> Self {
        ClientNetworks(cidrs)
    }

    /// Whether `ip` is on one of the networks ([`networks::allowed`]).
    #[must_use]
    pub fn allows(&self, ip: IpAddr) -> bool {
        networks::allowed(&self.0, ip)
    }

    /// Whether a client GID (an IP address on RoCE v2) is on one of them.
    #[must_use]
    pub fn allows_gid(&self, gid: [u8; 16]) -> bool {
        self.allows(IpAddr::V6(std::net::Ipv6Addr::from(gid)))
    }
}

/// What the seam needs to know of this server.
#[derive(Debug, Clone, Copy)]
pub struct Serving<'a> {
    /// Whether the fabric is open (`rdma: enabled` and it could be opened).
    pub fabric: bool,
    /// Whether this server has DC sessions (standard tokens).
    pub dc: bool,
    /// `rdma.allowed_client_networks`.
    pub networks: &'a ClientNetworks,
}

/// What a dialect's file makes of a token, before the networks rule.
#[derive(Debug)]
pub(crate) enum Offer {
    /// Declined (`x-amz-rdma-reply: 501`).
    Decline(Declined),
    /// Served in this dialect, if its endpoint is allowed.
    Serve(Dialect, RdmaToken),
}

/// Decides how an object request is served: refuses a token that is not
/// among the SigV4 signed headers s3s verified (`signed`; anonymous and
/// SigV2 requests never sign one), whatever the mode; asks the dialect
/// `x-amz-rdma-protocol` names; then refuses an endpoint outside
/// `rdma.allowed_client_networks`.
///
/// # Errors
/// [`RdmaError::NotSigned`], [`RdmaError::InvalidToken`],
/// [`RdmaError::EndpointNotAllowed`], duplicate tokens or markers.
pub fn decide(
    headers: &HeaderMap,
    signed: &[String],
    serving: &Serving<'_>,
) -> Result<Decision, RdmaError> {
    let Some(text) = headers::token_header(headers)? else {
        return Ok(Decision::Http);
    };
    if !headers::token_is_signed(signed) {
        return Err(RdmaError::NotSigned);
    }
    let offer = match marker(headers)? {
        Marker::S3dma => s3dma::offer(text, serving)?,
        Marker::Standard => cuobject_dc::offer(text, serving)?,
        Marker::Other(name) => {
            info!(
                protocol = %s3dma_service::escape::Escaped(&name),
                "a token in a dialect this server does not speak: declined (501)"
            );
            Offer::Decline(Declined::Dialect)
        }
    };
    match offer {
        Offer::Decline(why) => Ok(Decision::Decline(why)),
        Offer::Serve(dialect, token) => {
            let endpoint = token.endpoint()?;
            if !serving.networks.allows(endpoint.addr.ip()) {
                warn!(peer = %endpoint, ?dialect, "RDMA token names an endpoint outside rdma.allowed_client_networks: refused");
                return Err(RdmaError::EndpointNotAllowed);
            }
            Ok(Decision::Serve(dialect, token))
        }
    }
}

/// The dialect a tokened request speaks (its `x-amz-rdma-protocol`, which
/// SigV4 signs like every `x-amz-*` header: unsigned, the request was
/// refused before this).
///
/// # Errors
/// [`RequestError::BadProtocolHeader`].
fn marker(headers: &HeaderMap) -> Result<Marker, RequestError> {
    let mut values = headers.get_all(headers::RDMA_PROTOCOL).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(RequestError::BadProtocolHeader);
    }
    let text = first
        .map(|v| v.to_str().map_err(|_| RequestError::BadProtocolHeader))
        .transpose()?;
    Ok(Marker::of(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::headers::{RDMA_PROTOCOL, RDMA_TOKEN};
    use http::HeaderValue;

    #[test]
    fn decisions() {
        let networks = ClientNetworks::new(networks::default_allowed());
        let off = Serving {
            fabric: false,
            dc: false,
            networks: &networks,
        };
        let decide = |h: &HeaderMap, signed: &[String]| decide(h, signed, &off);
        let signed = vec!["host".to_owned(), RDMA_TOKEN.to_owned()];
        assert!(matches!(decide(&HeaderMap::new(), &[]), Ok(Decision::Http)));
        let mut h = HeaderMap::new();
        h.insert(RDMA_TOKEN, HeaderValue::from_static("x"));
        assert!(matches!(decide(&h, &[]), Err(RdmaError::NotSigned)));
        // A malformed standard token is the client's error.
        assert!(matches!(
            decide(&h, &signed),
            Err(RdmaError::InvalidToken(_))
        ));
        let standard =
            "00007f0000001000:00001000:00000001:0000:000001:1:00000000000000000000ffff7f000001";
        let rc = format!("01{}", "00".repeat(43));
        for token in [standard, rc.as_str()] {
            h.insert(RDMA_TOKEN, HeaderValue::from_str(token).unwrap());
            assert!(matches!(
                decide(&h, &signed),
                Ok(Decision::Decline(Declined::StandardToken))
            ));
        }
        h.insert(RDMA_PROTOCOL, HeaderValue::from_static("hipobj-rc-v2"));
        assert!(matches!(
            decide(&h, &signed),
            Ok(Decision::Decline(Declined::Dialect))
        ));
        h.insert(RDMA_PROTOCOL, HeaderValue::from_static("s3dma-v1"));
        h.insert(RDMA_TOKEN, HeaderValue::from_static(standard));
        assert!(matches!(
            decide(&h, &signed),
            Ok(Decision::Decline(Declined::Off))
        ));
        h.append(RDMA_PROTOCOL, HeaderValue::from_static("s3dma-v1"));
        assert!(matches!(
            decide(&h, &signed),
            Err(RdmaError::Request(RequestError::BadProtocolHeader))
        ));
        // The networks rule, once, for whichever dialect serves.
        h.insert(RDMA_PROTOCOL, HeaderValue::from_static("s3dma-v1"));
        let none = ClientNetworks::default();
        let on = Serving {
            fabric: true,
            dc: true,
            networks: &none,
        };
        assert!(matches!(
            super::decide(&h, &signed, &on),
            Err(RdmaError::EndpointNotAllowed)
        ));
        let on = Serving {
            networks: &networks,
            ..on
        };
        let d = super::decide(&h, &signed, &on).unwrap();
        assert_eq!(d.dialect(), Dialect::S3dma);
        assert!(d.token().is_some());
    }

    #[test]
    fn replies() {
        assert!(Decision::Http.get_reply(false, 0).is_empty());
        let d = Decision::Decline(Declined::Off);
        assert_eq!(d.dialect(), Dialect::S3dma);
        assert!(d.token().is_none());
        assert_eq!(d.get_reply(false, 0)[headers::RDMA_REPLY], "501");
        assert_eq!(Declined::Off.reason("off here"), "off here");
    }
}
