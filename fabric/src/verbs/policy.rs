//! Pure decisions of the verbs backend: GID selection, MTU negotiation and
//! completion-status mapping.

use rdma_sys::ibv_wc_status;

use crate::error::OpStatus;

/// Kind of a GID table entry (sysfs `gid_attrs/types/<index>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand (or "IB/RoCE v1" on RoCE ports).
    Ib,
    /// RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable): what we want on Ethernet.
    RoceV2,
}

/// Parses the sysfs GID type string.
pub fn parse_gid_type(s: &str) -> Option<GidType> {
    match s.trim() {
        "RoCE v2" => Some(GidType::RoceV2),
        "IB/RoCE v1" | "RoCE v1" => Some(GidType::RoceV1),
        "IB" => Some(GidType::Ib),
        _ => None,
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table (`sgid_index`).
    pub index: u8,
    /// The GID.
    pub gid: [u8; 16],
    /// Its type.
    pub ty: GidType,
}

fn rank(e: &GidEntry, link_layer_ethernet: bool) -> Option<u8> {
    if e.gid == [0; 16] {
        return None;
    }
    let v6 = std::net::Ipv6Addr::from(e.gid);
    let mapped_v4 = v6.to_ipv4_mapped().is_some();
    let link_local = e.gid[0] == 0xfe && (e.gid[1] & 0xc0) == 0x80;
    Some(match (e.ty, link_layer_ethernet) {
        (GidType::RoceV2, true) if mapped_v4 => 0,
        (GidType::RoceV2, true) if !link_local => 1,
        (GidType::RoceV2, true) => 2,
        (GidType::RoceV1, true) | (GidType::Ib, true) => 3,
        (GidType::Ib, false) => 0,
        _ => 4,
    })
}

/// Picks the GID to use: on Ethernet (RoCE) a RoCE v2 GID, preferring an
/// IPv4-mapped one, then a global IPv6 one, then link-local; on InfiniBand
/// the first valid GID. `None` if the table has no usable entry.
pub fn select_gid(entries: &[GidEntry], link_layer_ethernet: bool) -> Option<GidEntry> {
    entries
        .iter()
        .filter_map(|e| rank(e, link_layer_ethernet).map(|r| (r, e.index, *e)))
        .min_by_key(|(r, i, _)| (*r, *i))
        .map(|(_, _, e)| e)
}

/// What kind of address a GID is: a peer reaches only a local GID of its
/// own kind (an IPv4-mapped RoCE v2 GID routes over IPv4, a link-local one
/// only on the link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// `::ffff:a.b.c.d`: RoCE v2 over IPv4.
    Ipv4Mapped,
    /// `fe80::/10`.
    LinkLocal,
    /// Any other IPv6 address (or an InfiniBand GID).
    Ipv6,
}

impl GidKind {
    /// The kind of `gid`.
    #[must_use]
    pub fn of(gid: &[u8; 16]) -> GidKind {
        if std::net::Ipv6Addr::from(*gid).to_ipv4_mapped().is_some() {
            GidKind::Ipv4Mapped
        } else if gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80 {
            GidKind::LinkLocal
        } else {
            GidKind::Ipv6
        }
    }
}

/// The GID to use toward a peer whose GIDs are of `kind`: the best entry
/// ([`select_gid`]'s order) of that kind, else `None` (the port has no
/// address the peer can reach). On InfiniBand the kind does not matter.
#[must_use]
pub fn select_gid_of_kind(
    entries: &[GidEntry],
    link_layer_ethernet: bool,
    kind: GidKind,
) -> Option<GidEntry> {
    if !link_layer_ethernet {
        return select_gid(entries, false);
    }
    let same: Vec<GidEntry> = entries
        .iter()
        .filter(|e| GidKind::of(&e.gid) == kind)
        .copied()
        .collect();
    select_gid(&same, true)
}

/// How to choose the GID a DC target (or any passive endpoint a token
/// names) answers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GidChoice {
    /// A GID table index the operator chose: used as is when populated.
    pub index: Option<u8>,
    /// Whether a link-local (`fe80::/10`) GID may be chosen when the port
    /// has no routable one. Off by default, as the peers do: a link-local
    /// GID in a token reaches only servers on the same link.
    pub allow_link_local: bool,
}

/// Why no GID of a port fits a [`GidChoice`] ([`select_target_gid`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoTargetGid {
    /// The configured index has no GID.
    #[error("GID index {0} is not populated on this port")]
    NotPopulated(u8),
    /// An InfiniBand port without a valid GID.
    #[error("the port has no valid GID")]
    NoValid,
    /// A RoCE port without a RoCE v2 GID (link-local ones allowed).
    #[error("the port has no RoCE v2 GID")]
    NoRoceV2,
    /// A RoCE port without a routable RoCE v2 GID (link-local ones not allowed).
    #[error(
        "the port has no routable RoCE v2 GID (configure an IPv4 or global IPv6 \
         address on its netdev, or allow link-local GIDs)"
    )]
    NoRoutableRoceV2,
}

/// The GID a token names ([`GidChoice`]): the configured index, else on
/// RoCE the best routable RoCE v2 GID ([`select_gid`]'s order: IPv4-mapped
/// first; RoCE v1 never), a link-local one only when allowed; on
/// InfiniBand the first valid GID.
///
/// # Errors
/// Why no GID fits ([`NoTargetGid`]).
pub fn select_target_gid(
    entries: &[GidEntry],
    link_layer_ethernet: bool,
    choice: GidChoice,
) -> Result<GidEntry, NoTargetGid> {
    if let Some(index) = choice.index {
        return entries
            .iter()
            .find(|e| e.index == index && e.gid != [0; 16])
            .copied()
            .ok_or(NoTargetGid::NotPopulated(index));
    }
    if !link_layer_ethernet {
        return select_gid(entries, false).ok_or(NoTargetGid::NoValid);
    }
    let usable: Vec<GidEntry> = entries
        .iter()
        .filter(|e| e.ty == GidType::RoceV2)
        .filter(|e| choice.allow_link_local || GidKind::of(&e.gid) != GidKind::LinkLocal)
        .copied()
        .collect();
    select_gid(&usable, true).ok_or(if choice.allow_link_local {
        NoTargetGid::NoRoceV2
    } else {
        NoTargetGid::NoRoutableRoceV2
    })
}

/// Bytes of an `ibv_mtu` code (1 = 256 ... 5 = 4096).
pub fn mtu_bytes(code: u32) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128u32 << code)
}

/// The path MTU both sides can use.
pub fn path_mtu(local: u8, remote: u8) -> u8 {
    local.min(remote).max(1)
}

/// Maps a verbs work-completion status to the fabric's.
pub fn wc_status(status: u32) -> Result<(), OpStatus> {
    use ibv_wc_status::*;
    match status {
        IBV_WC_SUCCESS => Ok(()),
        IBV_WC_REM_ACCESS_ERR => Err(OpStatus::RemoteAccess),
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_INV_RD_REQ_ERR => Err(OpStatus::RemoteInvalidRequest),
        IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR | IBV_WC_RESP_TIMEOUT_ERR => {
            Err(OpStatus::RetryExceeded)
        }
        IBV_WC_WR_FLUSH_ERR => Err(OpStatus::Flushed),
        IBV_WC_LOC_LEN_ERR | IBV_WC_LOC_QP_OP_ERR | IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => {
            Err(OpStatus::LocalError)
        }
        _ => Err(OpStatus::RemoteOperation),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(index: u8, gid: &str, ty: GidType) -> GidEntry {
        GidEntry {
            index,
            gid: gid.parse::<std::net::Ipv6Addr>().unwrap().octets(),
            ty,
        }
    }

    #[test]
    fn gids_of_the_peers_kind() {
        let table = [
            e(0, "fe80::1", GidType::RoceV1),
            e(1, "fe80::1", GidType::RoceV2),
            e(2, "::ffff:10.0.0.5", GidType::RoceV1),
            e(3, "::ffff:10.0.0.5", GidType::RoceV2),
        ];
        let kind = |g: &str| GidKind::of(&g.parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(kind("::ffff:192.0.2.1"), GidKind::Ipv4Mapped);
        assert_eq!(kind("fe80::abcd"), GidKind::LinkLocal);
        assert_eq!(kind("febf::1"), GidKind::LinkLocal);
        assert_eq!(kind("fec0::1"), GidKind::Ipv6);
        assert_eq!(kind("fd00::5"), GidKind::Ipv6);
        let pick = |k| select_gid_of_kind(&table, true, k).map(|e| e.index);
        assert_eq!(pick(GidKind::Ipv4Mapped), Some(3));
        assert_eq!(pick(GidKind::LinkLocal), Some(1), "RoCE v2 first");
        assert_eq!(pick(GidKind::Ipv6), None, "no global IPv6 address here");
        assert_eq!(
            select_gid_of_kind(&table[..1], true, GidKind::LinkLocal).map(|e| e.index),
            Some(0)
        );
        // InfiniBand: the kind does not matter.
        let ib = [e(0, "fe80::2", GidType::Ib)];
        assert_eq!(
            select_gid_of_kind(&ib, false, GidKind::Ipv4Mapped).map(|e| e.index),
            Some(0)
        );
    }

    /// A RoCE port's table: v1 and v2 entries for a link-local and an
    /// IPv4 address, then a global IPv6 one.
    fn roce_table() -> [GidEntry; 5] {
        [
            e(0, "fe80::1", GidType::RoceV1),
            e(1, "fe80::1", GidType::RoceV2),
            e(2, "::ffff:10.0.0.5", GidType::RoceV1),
            e(3, "::ffff:10.0.0.5", GidType::RoceV2),
            e(4, "fd00::5", GidType::RoceV2),
        ]
    }

    #[test]
    fn target_gids_are_routable_unless_configured() {
        let table = roce_table();
        let auto = GidChoice::default();
        assert_eq!(select_target_gid(&table, true, auto).unwrap().index, 3);
        let err = select_target_gid(&table[..3], true, auto)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no routable RoCE v2 GID"),
            "RoCE v1 never: {err}"
        );
        assert_eq!(
            select_target_gid(&[table[0], table[4]], true, auto)
                .unwrap()
                .index,
            4
        );
        let ll = GidChoice {
            allow_link_local: true,
            ..auto
        };
        assert_eq!(select_target_gid(&table[..2], true, ll).unwrap().index, 1);
        let by_index = |i| GidChoice {
            index: Some(i),
            ..auto
        };
        assert_eq!(
            select_target_gid(&table, true, by_index(1)).unwrap().index,
            1
        );
        let err = select_target_gid(&table, true, by_index(9))
            .unwrap_err()
            .to_string();
        assert!(err.contains("index 9"), "{err}");
        let ib = [e(0, "fe80::2", GidType::Ib)];
        assert_eq!(select_target_gid(&ib, false, auto).unwrap().index, 0);
    }

    #[test]
    fn gid_selection_prefers_roce_v2_ipv4_mapped() {
        let table = roce_table();
        assert_eq!(select_gid(&table, true).unwrap().index, 3);
        assert_eq!(select_gid(&table[..3], true).unwrap().index, 1);
        assert_eq!(select_gid(&[table[0], table[4]], true).unwrap().index, 4);
        assert_eq!(select_gid(&[e(0, "::", GidType::RoceV2)], true), None);
        let ib = [e(0, "fe80::2", GidType::Ib), e(1, "fe80::3", GidType::Ib)];
        assert_eq!(select_gid(&ib, false).unwrap().index, 0);
        assert_eq!(parse_gid_type("RoCE v2\n"), Some(GidType::RoceV2));
        assert_eq!(parse_gid_type("IB/RoCE v1"), Some(GidType::RoceV1));
        assert_eq!(parse_gid_type("?"), None);
    }

    #[test]
    fn mtu() {
        assert_eq!(mtu_bytes(1), Some(256));
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(6), None);
        assert_eq!(path_mtu(5, 3), 3);
        assert_eq!(path_mtu(0, 0), 1);
    }

    #[test]
    fn statuses() {
        use ibv_wc_status::*;
        assert_eq!(wc_status(IBV_WC_SUCCESS), Ok(()));
        assert_eq!(
            wc_status(IBV_WC_REM_ACCESS_ERR),
            Err(OpStatus::RemoteAccess)
        );
        assert_eq!(
            wc_status(IBV_WC_REM_INV_REQ_ERR),
            Err(OpStatus::RemoteInvalidRequest)
        );
        assert_eq!(
            wc_status(IBV_WC_RETRY_EXC_ERR),
            Err(OpStatus::RetryExceeded)
        );
        assert_eq!(wc_status(IBV_WC_WR_FLUSH_ERR), Err(OpStatus::Flushed));
        assert_eq!(wc_status(IBV_WC_LOC_PROT_ERR), Err(OpStatus::LocalError));
        assert_eq!(
            wc_status(IBV_WC_GENERAL_ERR),
            Err(OpStatus::RemoteOperation)
        );
    }
}
