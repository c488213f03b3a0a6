//! The verbs backend's out-of-band queue-pair exchange (pure, no I/O).
//!
//! After the same authenticated handshake as the tcp fabric, each side sends
//! one 40-byte [`QpInfo`] (big-endian):
//!
//! ```text
//! 0 magic "S3DMAQPI" | 8 qpn u32 | 12 psn u32 | 16 lid u16 | 18 mtu u8
//! 19 reserved u8 | 20 reserved u32 | 24 gid [16]
//! ```

use crate::frame::FrameError;

/// Magic of a [`QpInfo`].
pub const QP_MAGIC: [u8; 8] = *b"S3DMAQPI";

/// What one side of an RC connection tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Active path MTU as an `ibv_mtu` value (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// The port GID chosen for the connection (RoCE v2: the IP address).
    pub gid: [u8; 16],
}

impl QpInfo {
    /// Encoded size.
    pub const LEN: usize = 40;

    /// Encodes the message.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&QP_MAGIC);
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..18].copy_from_slice(&self.lid.to_be_bytes());
        b[18] = self.mtu;
        b[24..40].copy_from_slice(&self.gid);
        b
    }

    /// Decodes and validates the message.
    pub fn decode(b: &[u8]) -> Result<QpInfo, FrameError> {
        if b.len() < Self::LEN {
            return Err(FrameError::Truncated {
                need: Self::LEN,
                got: b.len(),
            });
        }
        if b[0..8] != QP_MAGIC {
            return Err(FrameError::BadMagic);
        }
        if b[19] != 0 || b[20..24] != [0; 4] {
            return Err(FrameError::Reserved("qp info"));
        }
        let qpn = u32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
        let psn = u32::from_be_bytes(b[12..16].try_into().expect("4 bytes"));
        if qpn > 0x00ff_ffff || psn > 0x00ff_ffff {
            return Err(FrameError::Unexpected(format!(
                "qpn {qpn:#x} / psn {psn:#x} exceed 24 bits"
            )));
        }
        let mtu = b[18];
        if !(1..=5).contains(&mtu) {
            return Err(FrameError::Unexpected(format!(
                "path MTU code {mtu} is not 1..=5"
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[24..40]);
        Ok(QpInfo {
            qpn,
            psn,
            lid: u16::from_be_bytes([b[16], b[17]]),
            mtu,
            gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_validation() {
        let q = QpInfo {
            qpn: 0x123456,
            psn: 0xabcdef,
            lid: 7,
            mtu: 5,
            gid: [9; 16],
        };
        assert_eq!(QpInfo::decode(&q.encode()), Ok(q));
        let mut b = q.encode();
        b[8] = 1; // qpn > 24 bits
        assert!(QpInfo::decode(&b).is_err());
        let mut b = q.encode();
        b[18] = 6;
        assert!(QpInfo::decode(&b).is_err());
        let mut b = q.encode();
        b[0] = 0;
        assert_eq!(QpInfo::decode(&b), Err(FrameError::BadMagic));
        assert!(QpInfo::decode(&b[..10]).is_err());
    }
}
