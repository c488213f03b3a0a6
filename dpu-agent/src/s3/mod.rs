//! Talking S3 to storage targets: SigV4 signing ([`sign`]), the XML
//! documents ([`xml`]) and a keep-alive HTTP client per target ([`client`]).

pub mod client;
pub mod sign;
pub mod xml;

pub use client::{Reply, S3Call, TargetClient};
pub use sign::Signer;
