//! Opening a [`Domain`] on a backend: the one place that chooses a
//! backend's registration hook (so `region` knows no backend).

use crate::backend::Backend;
use crate::error::Result;
use crate::region::Domain;

impl Domain {
    /// Opens a domain on `backend`. [`Backend::Verbs`] fails with
    /// [`FabricError::Unavailable`](crate::FabricError::Unavailable) when the
    /// machine has no usable RDMA device, or when this build has no verbs
    /// backend (cargo feature `verbs`).
    pub fn open(backend: Backend) -> Result<Domain> {
        match backend {
            Backend::Tcp => Ok(Domain::tcp()),
            #[cfg(feature = "verbs")]
            Backend::Verbs => Ok(Domain::with_registrar(
                backend,
                Some(Box::new(crate::verbs::VerbsDomain::open_first()?)),
            )),
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => Err(crate::backend::verbs_not_built()),
        }
    }
}
