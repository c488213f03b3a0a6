//! Opening a [`Domain`] on a backend: the one place that chooses a
//! backend's registration hook (so `region` knows no backend).

use crate::backend::Backend;
use crate::error::Result;
use crate::rail::DeviceRail;
use crate::region::Domain;

impl Domain {
    /// Opens a domain on `backend`. [`Backend::Verbs`] fails with
    /// [`FabricError::Unavailable`](crate::FabricError::Unavailable) when the
    /// machine has no usable RDMA device, or when this build has no verbs
    /// backend (cargo feature `verbs`).
    pub fn open(backend: Backend) -> Result<Domain> {
        Domain::open_on(backend, None)
    }

    /// Opens a domain on `backend` over one rail's device port: on verbs
    /// `rail`'s device, port and GID (the first device's port 1 and the
    /// backend's GID choice when `None`, as [`Domain::open`]); on tcp,
    /// where a rail is an address and not a device, `rail` must be `None`.
    ///
    /// # Errors
    /// As [`Domain::open`]; a device that is not there (or has no such
    /// port or GID) is [`FabricError::Unavailable`](crate::FabricError::Unavailable)
    /// naming it; a device on tcp is
    /// [`FabricError::InvalidArgument`](crate::FabricError::InvalidArgument).
    pub fn open_on(backend: Backend, rail: Option<&DeviceRail>) -> Result<Domain> {
        match backend {
            Backend::Tcp => match rail {
                None => Ok(Domain::tcp()),
                Some(_) => Err(crate::FabricError::InvalidArgument(
                    "a tcp domain has no RDMA device to name".into(),
                )),
            },
            #[cfg(feature = "verbs")]
            Backend::Verbs => Ok(Domain::with_registrar(
                backend,
                Some(Box::new(crate::verbs::VerbsDomain::open(rail)?)),
            )),
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => {
                let _ = rail;
                Err(crate::backend::verbs_not_built())
            }
        }
    }

    /// The IP address this domain's queue pairs send from, where the
    /// backend has one: on verbs the address its GID carries (RoCE), for
    /// [`crate::rail::pick_local_rail`]; `None` on tcp, whose kernel routes
    /// each connection.
    #[must_use]
    pub fn gid_address(&self) -> Option<std::net::IpAddr> {
        match self.backend() {
            Backend::Tcp => None,
            #[cfg(feature = "verbs")]
            Backend::Verbs => crate::verbs::conn::verbs_of(self)
                .ok()
                .and_then(crate::verbs::VerbsDomain::gid_address),
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => None,
        }
    }

    /// Whether the domain's port can carry traffic now: a verbs port that
    /// is ACTIVE (its link up); always `true` on tcp. `false` too when the
    /// device cannot be asked.
    #[must_use]
    pub fn port_active(&self) -> bool {
        match self.backend() {
            Backend::Tcp => true,
            #[cfg(feature = "verbs")]
            Backend::Verbs => crate::verbs::conn::verbs_of(self)
                .and_then(crate::verbs::VerbsDomain::port_active)
                .unwrap_or(false),
            #[cfg(not(feature = "verbs"))]
            Backend::Verbs => false,
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
