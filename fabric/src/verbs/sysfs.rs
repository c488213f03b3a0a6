//! A port's GID table as the kernel shows it in sysfs
//! (`/sys/class/infiniband/<device>/ports/<port>/gids/<index>` and
//! `gid_attrs/types/<index>`), the way the field's peers read it to pick a
//! RoCE v2 GID. Plain file reads: the root is a parameter so that tests
//! run on fixture trees.

use std::path::Path;

use super::policy::{GidEntry, GidType, parse_gid_type};

/// Where the kernel puts it.
pub const ROOT: &str = "/sys/class/infiniband";

/// The type of GID `index` of `device`'s `port` under `root`; `None` when
/// the file is missing or unreadable (the kernel answers `EINVAL` for an
/// unpopulated entry) or names no known type.
#[must_use]
pub fn gid_type(root: &Path, device: &str, port: u8, index: u16) -> Option<GidType> {
    let path = root
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs/types")
        .join(index.to_string());
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| parse_gid_type(&s))
}

/// Parses a sysfs GID (`fe80:0000:0000:0000:0a00:27ff:fe00:0001`).
#[must_use]
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    text.trim()
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .map(|a| a.octets())
}

/// The populated entries of `device`'s `port` GID table under `root`
/// (entries with an all-zero GID or no readable type are left out), in
/// index order. An absent port reads as an empty table.
#[must_use]
pub fn gid_table(root: &Path, device: &str, port: u8) -> Vec<GidEntry> {
    let dir = root
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gids");
    let Ok(read) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut entries: Vec<GidEntry> = read
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let index: u8 = e.file_name().to_str()?.parse().ok()?;
            let gid = parse_gid(&std::fs::read_to_string(e.path()).ok()?)?;
            if gid == [0; 16] {
                return None;
            }
            let ty = gid_type(root, device, port, u16::from(index))?;
            Some(GidEntry { index, gid, ty })
        })
        .collect();
    entries.sort_by_key(|e| e.index);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::policy::{GidChoice, select_target_gid};

    /// Writes one port's table: `(index, gid text, type text)`; a `None`
    /// type leaves the type file out (as the kernel's EINVAL reads).
    fn fixture(root: &Path, device: &str, port: u8, rows: &[(u8, &str, Option<&str>)]) {
        let base = root.join(device).join("ports").join(port.to_string());
        std::fs::create_dir_all(base.join("gids")).unwrap();
        std::fs::create_dir_all(base.join("gid_attrs/types")).unwrap();
        for (i, gid, ty) in rows {
            std::fs::write(base.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
            if let Some(ty) = ty {
                std::fs::write(
                    base.join("gid_attrs/types").join(i.to_string()),
                    format!("{ty}\n"),
                )
                .unwrap();
            }
        }
    }

    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const LINK_LOCAL: &str = "fe80:0000:0000:0000:0a00:27ff:fe00:0001";
    const MAPPED: &str = "0000:0000:0000:0000:0000:ffff:0a4d:0001";

    /// A ConnectX port as mlx5 shows it: RoCE v1 and v2 entries for the
    /// link-local address and for an IPv4 address, then empty entries.
    #[test]
    fn an_mlx5_port_gives_its_ipv4_mapped_roce_v2_gid() {
        let dir = tempfile::tempdir().unwrap();
        fixture(
            dir.path(),
            "mlx5_0",
            1,
            &[
                (0, LINK_LOCAL, Some("IB/RoCE v1")),
                (1, LINK_LOCAL, Some("RoCE v2")),
                (2, MAPPED, Some("IB/RoCE v1")),
                (3, MAPPED, Some("RoCE v2")),
                (4, ZERO, None),
                (5, ZERO, Some("RoCE v2")),
            ],
        );
        let table = gid_table(dir.path(), "mlx5_0", 1);
        assert_eq!(
            table.iter().map(|e| (e.index, e.ty)).collect::<Vec<_>>(),
            [
                (0, GidType::RoceV1),
                (1, GidType::RoceV2),
                (2, GidType::RoceV1),
                (3, GidType::RoceV2)
            ]
        );
        let chosen = select_target_gid(&table, true, GidChoice::default()).unwrap();
        assert_eq!(chosen.index, 3);
        assert_eq!(
            std::net::Ipv6Addr::from(chosen.gid).to_ipv4_mapped(),
            Some(std::net::Ipv4Addr::new(10, 77, 0, 1))
        );
        assert_eq!(gid_type(dir.path(), "mlx5_0", 1, 4), None);
        assert_eq!(gid_type(dir.path(), "mlx5_0", 1, 1), Some(GidType::RoceV2));
    }

    /// A bond under RoCE LAG (`mlx5_bond_0`, one port for both links)
    /// whose netdev has no address yet: only link-local GIDs, so no DC
    /// target unless link-local is allowed or an index configured.
    #[test]
    fn a_bond_with_only_link_local_gids_needs_configuration() {
        let dir = tempfile::tempdir().unwrap();
        fixture(
            dir.path(),
            "mlx5_bond_0",
            1,
            &[
                (0, LINK_LOCAL, Some("IB/RoCE v1")),
                (1, LINK_LOCAL, Some("RoCE v2")),
            ],
        );
        let table = gid_table(dir.path(), "mlx5_bond_0", 1);
        let err = select_target_gid(&table, true, GidChoice::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("no routable RoCE v2 GID"), "{err}");
        let allowed = GidChoice {
            allow_link_local: true,
            index: None,
        };
        assert_eq!(select_target_gid(&table, true, allowed).unwrap().index, 1);
        let pinned = GidChoice {
            allow_link_local: false,
            index: Some(0),
        };
        assert_eq!(select_target_gid(&table, true, pinned).unwrap().index, 0);
    }

    /// Garbage, a missing port and unknown types read as nothing.
    #[test]
    fn unreadable_entries_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        fixture(
            dir.path(),
            "rxe0",
            1,
            &[
                (0, "not a gid", Some("RoCE v2")),
                (1, MAPPED, Some("RoCE v3")),
                (2, MAPPED, Some("RoCE v2")),
            ],
        );
        std::fs::write(dir.path().join("rxe0/ports/1/gids/notanindex"), MAPPED).unwrap();
        let table = gid_table(dir.path(), "rxe0", 1);
        assert_eq!(table.iter().map(|e| e.index).collect::<Vec<_>>(), [2]);
        assert!(gid_table(dir.path(), "rxe0", 2).is_empty());
        assert!(gid_table(dir.path(), "absent", 1).is_empty());
        assert_eq!(parse_gid(MAPPED).map(|g| g[15]), Some(1));
    }
}
