//! Rails: the fabric paths between a GPU host and the storage side.
//!
//! A rail is one fabric endpoint of a service: on tcp an IP address its
//! endpoint listens on (what its tokens name), on verbs one RDMA device
//! port (and GID) plus the tcp address its authenticated out-of-band
//! handshake listens on. [`RailConfig`] is one rail as a service's
//! `fabric:` section writes it, and [`validate_rails`] the check every
//! service runs on its list at start, so that a rail that does not exist is
//! an error and never a silent single rail.
//!
//! The device checks read sysfs (`/sys/class/infiniband`), the way the
//! kernel lists RDMA devices, so they work in builds without the `verbs`
//! feature too.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Backend;

/// The most rails one service may have (a token list names at most this
/// many).
pub const MAX_RAILS: usize = 8;

/// Where the kernel lists RDMA devices.
const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// One rail as a service's configuration names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RailConfig {
    /// Where this rail's fabric endpoint listens: on tcp the rail's own IP
    /// address (the interface its traffic uses; tokens name it), on verbs
    /// the address of the out-of-band handshake for this rail's device.
    pub listen: SocketAddr,
    /// The address tokens carry when `listen` is 0.0.0.0 or :: (required
    /// then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<IpAddr>,
    /// verbs only: the RDMA device of this rail (`mlx5_0`, `rxe1`, as
    /// `ibv_devices` and `/sys/class/infiniband` list them). Absent: the
    /// first device, which only a single rail may rely on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// verbs only: the device's port (1 or more; default 1).
    #[serde(default = "default_port")]
    pub port: u8,
    /// verbs only: the port's GID table entry the rail uses. Absent: the
    /// backend's own choice (a routable RoCE v2 GID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u8>,
}

fn default_port() -> u8 {
    1
}

impl RailConfig {
    /// A rail listening on `listen`, tokens naming `advertise` when it is
    /// unspecified, on the first device's port 1 (verbs): what a single
    /// `listen` (+ `advertise`) configuration means.
    #[must_use]
    pub fn new(listen: SocketAddr, advertise: Option<IpAddr>) -> RailConfig {
        RailConfig {
            listen,
            advertise,
            device: None,
            port: default_port(),
            gid_index: None,
        }
    }
}

/// One local rail of a service that only dials out over verbs (the
/// storage-target, a gateway): the RDMA device port its queue pairs use.
/// Which one serves a peer is [`pick_local_rail`]'s choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRail {
    /// The RDMA device (`mlx5_0`, `rxe1`, as `ibv_devices` and
    /// `/sys/class/infiniband` list them).
    pub device: String,
    /// The device's port (1 or more; default 1).
    #[serde(default = "default_port")]
    pub port: u8,
    /// The port's GID table entry the rail uses. Absent: the backend's own
    /// choice (a routable RoCE v2 GID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<u8>,
}

impl DeviceRail {
    /// Port 1 of `device`, the backend choosing the GID.
    #[must_use]
    pub fn new(device: impl Into<String>) -> DeviceRail {
        DeviceRail {
            device: device.into(),
            port: default_port(),
            gid_index: None,
        }
    }
}

impl RailConfig {
    /// The device port this rail names (verbs), `None` when it names no
    /// device (the first device's port 1: a single rail only).
    #[must_use]
    pub fn device_rail(&self) -> Option<DeviceRail> {
        self.device.as_ref().map(|device| DeviceRail {
            device: device.clone(),
            port: self.port,
            gid_index: self.gid_index,
        })
    }
}

/// The local rail that serves a peer at `peer`: the one whose own address
/// (`locals[i]`, its device's GID as an IP address; `None` when it has
/// none) shares the longest bit prefix with the peer's, IPv4 compared as
/// IPv4-mapped IPv6, ties to the lower index; 0 when `locals` is empty.
/// What an operator's routing does for one subnet per rail, with no
/// routing table of its own: a peer rail on 10.0.2.0/24 is served by the
/// local rail on 10.0.2.0/24.
#[must_use]
pub fn pick_local_rail(peer: IpAddr, locals: &[Option<IpAddr>]) -> usize {
    let bits = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    };
    let p = bits(peer);
    let mut best = (0, None::<u32>);
    for (i, local) in locals.iter().enumerate() {
        let Some(l) = local else { continue };
        let common = (p ^ bits(*l)).leading_zeros();
        if best.1.is_none_or(|b| common > b) {
            best = (i, Some(common));
        }
    }
    best.0
}

/// What is wrong with a rail list: the field (`rails[1].device`) and the
/// problem. [`RailError::field`] is relative to the list, so a service
/// reports it under its own section (`fabric.rails[1].device`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", self.field())]
pub struct RailError {
    /// The rail's position in the list; `None` for the list as a whole.
    pub index: Option<usize>,
    /// What is wrong.
    pub problem: RailProblem,
}

impl RailError {
    /// The field, relative to the rail list: `rails` or `rails[i].<name>`.
    #[must_use]
    pub fn field(&self) -> String {
        match self.index {
            None => "rails".into(),
            Some(i) => format!("rails[{i}].{}", self.problem.field()),
        }
    }
}

/// The problems [`validate_rails`] finds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RailProblem {
    /// An empty list.
    #[error("at least one rail is required")]
    Empty,
    /// More than [`MAX_RAILS`].
    #[error("at most {MAX_RAILS} rails are supported, not {0}")]
    TooMany(usize),
    /// Two rails listen on the same address.
    #[error("{addr} is also rails[{first}]'s listen address; each rail listens on its own")]
    DuplicateListen {
        /// The address.
        addr: SocketAddr,
        /// The earlier rail.
        first: usize,
    },
    /// An unspecified listen address without `advertise`.
    #[error(
        "is required when listen is 0.0.0.0 or :: (the address peers reach this rail on, which tokens name)"
    )]
    AdvertiseRequired,
    /// `advertise` itself unspecified.
    #[error("{0} cannot be reached; name the rail's own address")]
    AdvertiseUnspecified(IpAddr),
    /// A verbs-only field on the tcp backend.
    #[error("applies to the verbs backend only (a tcp rail is its listen address); remove it")]
    VerbsOnly(&'static str),
    /// Port 0.
    #[error("RDMA device ports are numbered from 1")]
    PortZero,
    /// Several verbs rails, one without a device.
    #[error("with several verbs rails each names its RDMA device ({0})")]
    DeviceRequired(String),
    /// The device does not exist.
    #[error("no RDMA device `{name}` on this machine ({present})")]
    NoDevice {
        /// The name configured (escaped).
        name: String,
        /// The devices there are, or why there are none.
        present: String,
    },
    /// The device has no such port.
    #[error("RDMA device `{device}` has no port {port} (its ports: {present})")]
    NoPort {
        /// The device (escaped).
        device: String,
        /// The port configured.
        port: u8,
        /// The ports it has.
        present: String,
    },
    /// The port's GID table has no such (populated) entry.
    #[error("RDMA device `{device}` port {port} has no GID at index {index}")]
    NoGid {
        /// The device (escaped).
        device: String,
        /// The port.
        port: u8,
        /// The index configured.
        index: u8,
    },
    /// Two rails on the same device port.
    #[error("device `{device}` port {port} is also rails[{first}]'s; each rail is its own port")]
    DuplicatePort {
        /// The device (escaped).
        device: String,
        /// The port.
        port: u8,
        /// The earlier rail.
        first: usize,
    },
}

impl RailProblem {
    /// The field of the rail the problem is in.
    fn field(&self) -> &'static str {
        match self {
            RailProblem::Empty | RailProblem::TooMany(_) => "",
            RailProblem::DuplicateListen { .. } => "listen",
            RailProblem::AdvertiseRequired | RailProblem::AdvertiseUnspecified(_) => "advertise",
            RailProblem::VerbsOnly(f) => f,
            RailProblem::PortZero
            | RailProblem::NoPort { .. }
            | RailProblem::DuplicatePort { .. } => "port",
            RailProblem::DeviceRequired(_) | RailProblem::NoDevice { .. } => "device",
            RailProblem::NoGid { .. } => "gid_index",
        }
    }
}

/// Checks a service's rails for `backend` before anything listens: 1 to
/// [`MAX_RAILS`] rails with distinct listen addresses, `advertise` where
/// `listen` is unspecified; on tcp no verbs-only field (`device`,
/// `gid_index`, a `port` other than 1); on verbs every device, port and
/// GID index named exists on this machine, no two rails share a device
/// port, and with several rails each names its device.
///
/// # Errors
/// The first [`RailError`] found, naming the rail and field; a missing
/// device's error lists the devices present.
pub fn validate_rails(backend: Backend, rails: &[RailConfig]) -> Result<(), RailError> {
    validate_rails_in(backend, rails, Path::new(SYSFS_ROOT))
}

/// [`validate_rails`] with the RDMA devices listed under `root` (a
/// fixture tree in tests).
pub(crate) fn validate_rails_in(
    backend: Backend,
    rails: &[RailConfig],
    root: &Path,
) -> Result<(), RailError> {
    let whole = |problem| RailError {
        index: None,
        problem,
    };
    if rails.is_empty() {
        return Err(whole(RailProblem::Empty));
    }
    if rails.len() > MAX_RAILS {
        return Err(whole(RailProblem::TooMany(rails.len())));
    }
    for (i, r) in rails.iter().enumerate() {
        let at = |problem| RailError {
            index: Some(i),
            problem,
        };
        if let Some(first) = rails[..i].iter().position(|o| o.listen == r.listen) {
            return Err(at(RailProblem::DuplicateListen {
                addr: r.listen,
                first,
            }));
        }
        match r.advertise {
            Some(ip) if ip.is_unspecified() => {
                return Err(at(RailProblem::AdvertiseUnspecified(ip)));
            }
            None if r.listen.ip().is_unspecified() => {
                return Err(at(RailProblem::AdvertiseRequired));
            }
            _ => {}
        }
        match backend {
            Backend::Tcp => {
                if r.device.is_some() {
                    return Err(at(RailProblem::VerbsOnly("device")));
                }
                if r.gid_index.is_some() {
                    return Err(at(RailProblem::VerbsOnly("gid_index")));
                }
                if r.port != default_port() {
                    return Err(at(RailProblem::VerbsOnly("port")));
                }
            }
            Backend::Verbs => check_verbs_rail(rails, i, root).map_err(at)?,
        }
    }
    Ok(())
}

/// The device port a rail names, as the verbs checks see it.
struct PortRef<'a> {
    device: Option<&'a str>,
    port: u8,
    gid_index: Option<u8>,
}

fn check_verbs_rail(rails: &[RailConfig], i: usize, root: &Path) -> Result<(), RailProblem> {
    let ports: Vec<PortRef<'_>> = rails
        .iter()
        .map(|r| PortRef {
            device: r.device.as_deref(),
            port: r.port,
            gid_index: r.gid_index,
        })
        .collect();
    check_port(&ports, i, root)
}

/// Checks a list of [`DeviceRail`]s (the `rdma.rails` of a service that
/// dials out): 1 to [`MAX_RAILS`], every device, port and GID index on
/// this machine, no device port twice.
///
/// # Errors
/// The first [`RailError`] found, naming the rail and field.
pub fn validate_device_rails(rails: &[DeviceRail]) -> Result<(), RailError> {
    validate_device_rails_in(rails, Path::new(SYSFS_ROOT))
}

fn validate_device_rails_in(rails: &[DeviceRail], root: &Path) -> Result<(), RailError> {
    let whole = |problem| RailError {
        index: None,
        problem,
    };
    if rails.is_empty() {
        return Err(whole(RailProblem::Empty));
    }
    if rails.len() > MAX_RAILS {
        return Err(whole(RailProblem::TooMany(rails.len())));
    }
    let ports: Vec<PortRef<'_>> = rails
        .iter()
        .map(|r| PortRef {
            device: Some(r.device.as_str()),
            port: r.port,
            gid_index: r.gid_index,
        })
        .collect();
    (0..rails.len()).try_for_each(|i| {
        check_port(&ports, i, root).map_err(|problem| RailError {
            index: Some(i),
            problem,
        })
    })
}

fn check_port(rails: &[PortRef<'_>], i: usize, root: &Path) -> Result<(), RailProblem> {
    let r = &rails[i];
    if r.port == 0 {
        return Err(RailProblem::PortZero);
    }
    let present = devices(root);
    let device = match r.device {
        Some(d) => d.to_owned(),
        None if rails.len() > 1 => {
            return Err(RailProblem::DeviceRequired(describe_devices(&present)));
        }
        // A single rail on the first device, as `Domain::open` picks it
        // (libibverbs lists devices in the kernel's order; sysfs sorted).
        None => match present.first() {
            Some(d) => d.clone(),
            None => {
                return Err(RailProblem::NoDevice {
                    name: "(the first)".into(),
                    present: describe_devices(&present),
                });
            }
        },
    };
    let shown = escaped(&device);
    if !present.contains(&device) {
        return Err(RailProblem::NoDevice {
            name: shown,
            present: describe_devices(&present),
        });
    }
    let ports = ports(root, &device);
    if !ports.contains(&r.port) {
        return Err(RailProblem::NoPort {
            device: shown,
            port: r.port,
            present: if ports.is_empty() {
                "none listed".into()
            } else {
                join(&ports)
            },
        });
    }
    if let Some(index) = r.gid_index
        && !gid_populated(root, &device, r.port, index)
    {
        return Err(RailProblem::NoGid {
            device: shown,
            port: r.port,
            index,
        });
    }
    if let Some(first) = rails[..i]
        .iter()
        .position(|o| o.device == Some(device.as_str()) && o.port == r.port)
    {
        return Err(RailProblem::DuplicatePort {
            device: shown,
            port: r.port,
            first,
        });
    }
    Ok(())
}

fn escaped(name: &str) -> String {
    s3dma_config::Escaped(name).to_string()
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The RDMA devices under `root`, sorted by name.
pub(crate) fn devices(root: &Path) -> Vec<String> {
    let Ok(read) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut names: Vec<String> = read
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// "present: a, b" or why there are none, for error messages.
pub(crate) fn describe_devices(present: &[String]) -> String {
    if present.is_empty() {
        format!(
            "this machine has no RDMA devices: {SYSFS_ROOT} is empty or absent (no RDMA NIC, its driver not loaded, or rdma_rxe not set up)"
        )
    } else {
        let shown: Vec<String> = present.iter().map(|d| escaped(d)).collect();
        format!("present: {}", shown.join(", "))
    }
}

/// The ports of `device` under `root`, sorted.
fn ports(root: &Path, device: &str) -> Vec<u8> {
    let Ok(read) = std::fs::read_dir(root.join(device).join("ports")) else {
        return Vec::new();
    };
    let mut ports: Vec<u8> = read
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    ports.sort_unstable();
    ports
}

/// Whether GID `index` of `device`'s `port` under `root` holds a GID (the
/// kernel shows unpopulated entries as all zeros, or refuses to read them).
fn gid_populated(root: &Path, device: &str, port: u8, index: u8) -> bool {
    let path = root
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gids")
        .join(index.to_string());
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.trim().parse::<std::net::Ipv6Addr>().ok())
        .is_some_and(|g| !g.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GID: &str = "0000:0000:0000:0000:0000:ffff:0a4d:0001";
    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";

    /// A device with `ports`, each with GID 0 populated and GID 1 empty.
    fn device(root: &Path, name: &str, ports: &[u8]) {
        for p in ports {
            let gids = root
                .join(name)
                .join("ports")
                .join(p.to_string())
                .join("gids");
            std::fs::create_dir_all(&gids).unwrap();
            std::fs::write(gids.join("0"), format!("{GID}\n")).unwrap();
            std::fs::write(gids.join("1"), format!("{ZERO}\n")).unwrap();
        }
    }

    fn rail(listen: &str) -> RailConfig {
        RailConfig::new(listen.parse().unwrap(), None)
    }

    fn verbs(listen: &str, dev: &str, port: u8) -> RailConfig {
        RailConfig {
            device: Some(dev.into()),
            port,
            ..rail(listen)
        }
    }

    fn err(backend: Backend, rails: &[RailConfig], root: &Path) -> String {
        validate_rails_in(backend, rails, root)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn yaml_rails_parse_with_defaults_and_refuse_unknown_fields() {
        let r: Vec<RailConfig> = serde_yaml::from_str(
            "- listen: 10.0.1.1:7000\n- listen: 0.0.0.0:7001\n  advertise: 10.0.2.1\n  device: mlx5_1\n  port: 2\n  gid_index: 3\n",
        )
        .unwrap();
        assert_eq!(r[0], rail("10.0.1.1:7000"));
        assert_eq!(r[1].advertise, Some("10.0.2.1".parse().unwrap()));
        assert_eq!(
            (r[1].device.as_deref(), r[1].port, r[1].gid_index),
            (Some("mlx5_1"), 2, Some(3))
        );
        let e =
            serde_yaml::from_str::<Vec<RailConfig>>("- listen: 10.0.1.1:7000\n  devcie: mlx5_0\n")
                .unwrap_err()
                .to_string();
        assert!(e.contains("unknown field `devcie`"), "{e}");
        // What the launcher writes reads back the same.
        let text = serde_yaml::to_string(&r).unwrap();
        assert_eq!(serde_yaml::from_str::<Vec<RailConfig>>(&text).unwrap(), r);
        assert!(!serde_yaml::to_string(&r[0]).unwrap().contains("device"));
    }

    #[test]
    fn tcp_rails() {
        let none = Path::new("/nonexistent");
        let two = [rail("10.0.1.1:7000"), rail("10.0.2.1:7000")];
        validate_rails_in(Backend::Tcp, &two, none).unwrap();
        validate_rails_in(Backend::Tcp, &two[..1], none).unwrap();
        assert_eq!(
            err(Backend::Tcp, &[], none),
            "rails: at least one rail is required"
        );
        let nine: Vec<RailConfig> = (0..9).map(|i| rail(&format!("10.0.{i}.1:7000"))).collect();
        assert!(err(Backend::Tcp, &nine, none).contains("at most 8 rails"));
        validate_rails_in(Backend::Tcp, &nine[..8], none).unwrap();
        let dup = [
            rail("10.0.1.1:7000"),
            rail("10.0.2.1:7000"),
            rail("10.0.1.1:7000"),
        ];
        let e = validate_rails_in(Backend::Tcp, &dup, none).unwrap_err();
        assert_eq!(e.field(), "rails[2].listen");
        assert!(e.to_string().contains("also rails[0]'s"), "{e}");
        let e = validate_rails_in(Backend::Tcp, &[rail("0.0.0.0:7000")], none).unwrap_err();
        assert_eq!(e.field(), "rails[0].advertise");
        let mut adv = rail("0.0.0.0:7000");
        adv.advertise = Some("10.0.1.1".parse().unwrap());
        validate_rails_in(Backend::Tcp, &[adv.clone()], none).unwrap();
        adv.advertise = Some("::".parse().unwrap());
        assert!(err(Backend::Tcp, &[adv], none).starts_with("rails[0].advertise: :: cannot"));
        for (r, field) in [
            (verbs("10.0.1.1:7000", "mlx5_0", 1), "device"),
            (
                RailConfig {
                    gid_index: Some(1),
                    ..rail("10.0.1.1:7000")
                },
                "gid_index",
            ),
            (
                RailConfig {
                    port: 2,
                    ..rail("10.0.1.1:7000")
                },
                "port",
            ),
        ] {
            let e = validate_rails_in(Backend::Tcp, &[r], none).unwrap_err();
            assert_eq!(e.field(), format!("rails[0].{field}"));
            assert!(e.to_string().contains("verbs backend only"), "{e}");
        }
    }

    #[test]
    fn verbs_rails_name_devices_ports_and_gids_that_exist() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        device(root, "mlx5_0", &[1]);
        device(root, "mlx5_1", &[1, 2]);
        let two = [
            verbs("10.0.1.1:7000", "mlx5_0", 1),
            verbs("10.0.2.1:7000", "mlx5_1", 2),
        ];
        validate_rails_in(Backend::Verbs, &two, root).unwrap();
        // A single rail may leave the device out: the first one.
        validate_rails_in(Backend::Verbs, &[rail("10.0.1.1:7000")], root).unwrap();
        let e = err(
            Backend::Verbs,
            &[verbs("10.0.1.1:7000", "mlx5_0", 1), rail("10.0.2.1:7000")],
            root,
        );
        assert!(
            e.starts_with("rails[1].device: with several verbs rails"),
            "{e}"
        );
        let e = err(Backend::Verbs, &[verbs("10.0.1.1:7000", "mlx5_3", 1)], root);
        assert_eq!(
            e,
            "rails[0].device: no RDMA device `mlx5_3` on this machine (present: mlx5_0, mlx5_1)"
        );
        let e = err(Backend::Verbs, &[verbs("10.0.1.1:7000", "mlx5_0", 2)], root);
        assert_eq!(
            e,
            "rails[0].port: RDMA device `mlx5_0` has no port 2 (its ports: 1)"
        );
        let e = err(Backend::Verbs, &[verbs("10.0.1.1:7000", "mlx5_0", 0)], root);
        assert!(
            e.starts_with("rails[0].port: RDMA device ports are numbered from 1"),
            "{e}"
        );
        let mut g = verbs("10.0.1.1:7000", "mlx5_1", 2);
        g.gid_index = Some(0);
        validate_rails_in(Backend::Verbs, &[g.clone()], root).unwrap();
        for index in [1, 7] {
            g.gid_index = Some(index);
            let e = err(Backend::Verbs, &[g.clone()], root);
            assert_eq!(
                e,
                format!(
                    "rails[0].gid_index: RDMA device `mlx5_1` port 2 has no GID at index {index}"
                )
            );
        }
        let e = err(
            Backend::Verbs,
            &[
                verbs("10.0.1.1:7000", "mlx5_1", 1),
                verbs("10.0.2.1:7000", "mlx5_1", 1),
            ],
            root,
        );
        assert!(
            e.starts_with("rails[1].port: device `mlx5_1` port 1 is also rails[0]'s"),
            "{e}"
        );
        // A hostile name is shown escaped.
        let e = err(
            Backend::Verbs,
            &[verbs("10.0.1.1:7000", "x\n\u{1b}[2J", 1)],
            root,
        );
        assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e}");
    }

    #[test]
    fn device_rails_parse_and_name_what_exists() {
        let r: Vec<DeviceRail> =
            serde_yaml::from_str("- device: rxe0\n- device: rxe1\n  port: 2\n  gid_index: 0\n")
                .unwrap();
        assert_eq!(r[0], DeviceRail::new("rxe0"));
        assert_eq!((r[1].port, r[1].gid_index), (2, Some(0)));
        assert!(
            serde_yaml::from_str::<Vec<DeviceRail>>("- device: rxe0\n  listen: 1.2.3.4:5\n")
                .is_err()
        );
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        device(root, "rxe0", &[1]);
        device(root, "rxe1", &[1, 2]);
        validate_device_rails_in(&r, root).unwrap();
        let e = validate_device_rails_in(&[], root).unwrap_err();
        assert_eq!(e.to_string(), "rails: at least one rail is required");
        let e = validate_device_rails_in(&[r[0].clone(), DeviceRail::new("rxe9")], root)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "rails[1].device: no RDMA device `rxe9` on this machine (present: rxe0, rxe1)"
        );
        let e = validate_device_rails_in(&[r[0].clone(), r[0].clone()], root)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("rails[1].port: device `rxe0` port 1 is also rails[0]'s"),
            "{e}"
        );
        let mut g = r[1].clone();
        g.gid_index = Some(1);
        let e = validate_device_rails_in(&[g], root).unwrap_err();
        assert_eq!(e.field(), "rails[0].gid_index");
    }

    #[test]
    fn the_local_rail_sharing_the_longest_prefix_serves_a_peer() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let locals = [ip("10.77.0.1"), ip("10.77.1.1")];
        let pick = |peer: &str| pick_local_rail(peer.parse().unwrap(), &locals);
        assert_eq!(pick("10.77.1.1"), 1);
        assert_eq!(pick("10.77.1.200"), 1);
        assert_eq!(pick("10.77.0.9"), 0);
        // Nothing shared beyond the IPv4-mapped prefix: the first rail.
        assert_eq!(pick("192.0.2.1"), 0);
        assert_eq!(pick("127.0.0.1"), 0);
        assert_eq!(pick_local_rail("10.0.0.1".parse().unwrap(), &[]), 0);
        // A rail without an address never wins over one with.
        assert_eq!(
            pick_local_rail("10.77.1.1".parse().unwrap(), &[None, ip("10.77.1.1")]),
            1
        );
        assert_eq!(
            pick_local_rail(
                "fd00:1::5".parse().unwrap(),
                &[ip("fd00:2::1"), ip("fd00:1::1")]
            ),
            1
        );
    }

    #[test]
    fn a_machine_without_rdma_devices_says_so() {
        let dir = tempfile::tempdir().unwrap();
        for rails in [
            vec![rail("10.0.1.1:7000")],
            vec![verbs("10.0.1.1:7000", "rxe0", 1)],
        ] {
            let e = err(Backend::Verbs, &rails, &dir.path().join("absent"));
            assert!(e.starts_with("rails[0].device: no RDMA device"), "{e}");
            assert!(e.contains("this machine has no RDMA devices"), "{e}");
        }
    }
}
