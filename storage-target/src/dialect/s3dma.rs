//! s3dma-v1, s3dma's own exchange: the signed marker `x-amz-rdma-protocol:
//! s3dma-v1` and a token whose fields name an s3dma fabric endpoint (a
//! session of [`fabric::pool::SessionPool`] to it carries the bytes).

use fabric::RdmaToken;

use super::{Declined, Dialect, Offer, Serving};
use crate::rdma::error::RdmaError;

/// What s3dma-v1 makes of the token `text`: declined while the fabric is
/// off, served over the fabric otherwise.
///
/// # Errors
/// [`RdmaError::InvalidToken`] for a token that does not parse.
pub(crate) fn offer(text: &str, serving: &Serving<'_>) -> Result<Offer, RdmaError> {
    if !serving.fabric {
        return Ok(Offer::Decline(Declined::Off));
    }
    Ok(Offer::Serve(Dialect::S3dma, RdmaToken::parse(text)?))
}
