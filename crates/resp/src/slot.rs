//! Redis Cluster hash slots: which of the 16,384 slots a key belongs to.
//!
//! RowanKV's shards own contiguous slot ranges so that cluster-aware Redis clients
//! compute a key's route themselves. The function must therefore agree with Redis
//! Cluster to the bit: `HASH_SLOT = CRC16(key) mod 16384`, where CRC16 is the XMODEM
//! variant (polynomial 0x1021, initial value 0, no reflection, no final xor; check
//! value 0x31C3 for `123456789`), and where a key containing a hash tag hashes only
//! the tag:
//!
//! - find the first `{`; if there is none, hash the whole key;
//! - find the first `}` after it; if there is none, or it follows the `{` at once
//!   (`{}`), hash the whole key;
//! - otherwise hash the bytes between them.
//!
//! So `{user1000}.following` and `{user1000}.followers` share a slot, `foo{}{bar}`
//! hashes the whole key, and `foo{{bar}}zap` hashes `{bar`.

use crc::{Crc, CRC_16_XMODEM};

/// Redis Cluster's number of hash slots.
pub const SLOT_COUNT: u16 = 16384;

// The slot is the CRC's low 14 bits: `mod SLOT_COUNT` is a mask only for a power of two.
const _: () = assert!(SLOT_COUNT.is_power_of_two());

const CRC16: Crc<u16> = Crc::<u16>::new(&CRC_16_XMODEM);

/// The bytes of `key` that decide its slot: its hash tag if it has a non-empty one,
/// else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let after = &key[open + 1..];
    match after.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => &after[..close],
        _ => key,
    }
}

/// The hash slot of `key`, in `0..SLOT_COUNT`.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOT_COUNT
}

/// Redis Cluster's CRC16 (XMODEM) of `bytes`.
pub fn crc16(bytes: &[u8]) -> u16 {
    CRC16.checksum(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_check_value() {
        // The cluster specification's "Output for 123456789".
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOT_COUNT);
        assert_eq!(key_slot(b"123456789"), 12739);
    }

    #[test]
    fn known_slots() {
        // Values Redis's CLUSTER KEYSLOT gives.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"bar{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{user1}.following"), 8106);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn hash_tags() {
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(hash_tag(b"{user1000}.following"), b"user1000");
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOT_COUNT);
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"foo{bar"), b"foo{bar");
        assert_eq!(hash_tag(b"foo}bar{"), b"foo}bar{");
        assert_eq!(hash_tag(b"{"), b"{");
        assert_eq!(hash_tag(b"{}"), b"{}");
        assert_eq!(hash_tag(b"a{b}"), b"b");
        assert_eq!(hash_tag(b"\xff{\0}"), b"\0");
    }

    #[test]
    fn slots_are_in_range() {
        for i in 0..10_000u32 {
            assert!(key_slot(format!("key:{i}").as_bytes()) < SLOT_COUNT);
        }
    }
}
