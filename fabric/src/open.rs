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

    /// A domain on the same device whose protection domain is its own:
    /// memory registered in it is reachable only from queue pairs created
    /// in it, so one peer's queue pair cannot touch another request's
    /// memory even with its real key and address (verbs keys are guessable
    /// MR indices). On tcp, where every key is checked by the one endpoint
    /// serving a domain, it is this domain (a key there is 32 random bits
    /// behind the fabric key).
    ///
    /// # Errors
    /// The device has no protection domain left (`ibv_alloc_pd`).
    pub fn isolated(&self) -> Result<Domain> {
        match self.backend() {
            Backend::Tcp => Ok(self.clone()),
            #[cfg(feature = "verbs")]
            Backend::Verbs => {
                let v = crate::verbs::conn::verbs_of(self)?;
                Ok(Domain::with_registrar(
                    Backend::Verbs,
                    Some(Box::new(v.isolated()?)),
                ))
            }
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => Err(crate::backend::verbs_not_built()),
        }
    }
}
