#![warn(missing_docs)]
//! s3dma's one-sided RDMA data plane.
//!
//! * [`Domain`] owns registrations; [`Domain::register`] turns [`Memory`]
//!   into a [`Region`] (address, length, access, rkey); [`Region::window`]
//!   mints a narrower, revocable [`Window`] with an access subset and an
//!   optional expiry.
//! * [`Endpoint::listen`] serves one-sided operations on a domain's regions;
//!   [`Session::connect`] reaches an endpoint and posts [`Session::write`] /
//!   [`Session::read`] with many operations outstanding. Each completes with
//!   success or an [`OpError`] carrying a verbs-like [`OpStatus`]. An
//!   in-flight operation owns its [`LocalSlice`] until it completes, so
//!   dropping its [`Completion`] never frees memory the peer still uses.
//!   [`Session::write_file`] sends a [`FileRange`] instead of registered
//!   memory where the backend can ([`Session::sends_files`]: tcp, with
//!   `sendfile(2)`), so a server's file data reaches the socket without a
//!   staging copy.
//! * [`token`] (re-exported from `s3dma-wire`, where every wire format
//!   lives) is the `x-amz-rdma-token` codec and the mapping between a token
//!   and an endpoint address plus remote buffer.
//! * Backends: [`Backend::Tcp`] (software RDMA over authenticated TCP)
//!   everywhere, and [`Backend::Verbs`] (rdma-sys, cargo feature `verbs`)
//!   where an RDMA device exists; opening a verbs domain without one, or in a
//!   build without the feature, fails with [`FabricError::Unavailable`],
//!   which callers use to fall back to tcp.
//! * [`pool`] holds what request-serving programs build on a domain: a
//!   bounded staging pool carved from one registered region and sessions
//!   pooled per endpoint; [`config`] reads the fabric key file and backend
//!   names.
//!
//! # Backend differences
//!
//! Both backends complete operations with the same [`OpStatus`] values, but:
//!
//! * after a remote error a verbs RC queue pair is in the error state and
//!   flushes everything after it; a tcp session drains the refused payload
//!   and keeps going. Pools should drop a session once
//!   [`Session::is_alive`] is false either way;
//! * dropping a tcp [`Session`] lets already-posted operations finish;
//!   dropping a verbs session destroys its queue pair and the outstanding
//!   operations complete as [`OpStatus::Flushed`] (their memory is released
//!   only after the queue pair is gone);
//! * window expiry is checked at every placement on tcp; on verbs a timer
//!   deregisters the window's memory registration when it expires;
//! * on tcp, CUDA regions are served through a host bounce buffer and may only
//!   be the remote side; on verbs they are registered with
//!   `ibv_reg_dmabuf_mr` (feature `cuda`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), fabric::FabricError> {
//! use fabric::*;
//! let key = FabricKey::random();
//! let domain = Domain::tcp();
//! let target = domain.alloc(1 << 20, Access::ALL)?;
//! let window = target.window(0, 4096, Access::REMOTE_WRITE, None)?;
//! let endpoint = Endpoint::listen(&domain, EndpointConfig::new("127.0.0.1:0".parse().unwrap(), key.clone())).await?;
//! let token = endpoint.token(&window)?; // what goes into x-amz-rdma-token
//!
//! // The other side: parse the token, connect, write.
//! let token: RdmaToken = token.to_string().parse().unwrap();
//! let staging = Domain::tcp().alloc(4096, Access::LOCAL_WRITE)?;
//! let session = Session::connect(staging.domain(), token.endpoint().unwrap(), SessionConfig::new(key)).await?;
//! session.write(staging.as_slice(), token.addr, token.rkey).await?;
//! # Ok(()) }
//! ```

mod access;
mod backend;
mod completion;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
mod endpoint;
mod error;
mod file;
mod handshake;
mod listener;
mod memory;
mod open;
mod options;
pub mod pool;
pub mod rail;
mod region;
mod session;
mod sock;
mod tcp;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use access::Access;
pub use backend::Backend;
pub use completion::Completion;
pub use endpoint::Endpoint;
pub use error::{FabricError, OpError, Result};
pub use file::FileRange;
pub use memory::{Memory, MemoryKind};
pub use options::{EndpointConfig, SessionConfig};
pub use region::{Domain, LocalSlice, Region, Window};
pub use s3dma_wire::token;
pub use s3dma_wire::{EndpointAddr, FabricKey, OpStatus, RdmaToken, RemoteBuf, TokenError};
pub use session::Session;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Domain>();
        check::<Region>();
        check::<Window>();
        check::<LocalSlice>();
        check::<Endpoint>();
        check::<Session>();
        check::<Completion>();
        check::<Memory>();
    }

    #[test]
    fn backend_names() {
        assert_eq!("tcp".parse::<Backend>().unwrap(), Backend::Tcp);
        assert_eq!("verbs".parse::<Backend>().unwrap(), Backend::Verbs);
        assert!(
            "rdma"
                .parse::<Backend>()
                .unwrap_err()
                .to_string()
                .contains("tcp")
        );
    }
}
