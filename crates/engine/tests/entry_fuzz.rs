//! Fuzzing of the log-entry decoders (`rowankv_engine::entry`) with proptest: they
//! take bytes from PM and the network, so they must never panic, and a damaged entry
//! must never decode to content other than what was written.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rowankv_engine::entry::{
    encode, encoded_len, parse_block, parse_entry, read_key, Assembler, BlockHeader, EntryError,
    Kind, HEADER_BYTES, MTU_BYTES_MIN, STRIDE_BYTES,
};
use rowankv_types::{ShardId, Version};

const CASES: u32 = 2048;

fn config() -> Config {
    Config {
        cases: CASES,
        // Failures print their minimal input; no regression files in the tree.
        failure_persistence: None,
        ..Config::default()
    }
}

/// A valid entry to encode.
#[derive(Clone, Debug)]
struct Spec {
    kind: Kind,
    shard: ShardId,
    version: Version,
    key: Vec<u8>,
    value: Vec<u8>,
    mtu_bytes: usize,
}

impl Spec {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let cnt = encode(
            &mut out,
            self.kind,
            self.shard,
            self.version,
            &self.key,
            &self.value,
            self.mtu_bytes,
        )
        .expect("a valid spec encodes");
        assert!(cnt >= 1);
        out
    }
}

fn mtu_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(MTU_BYTES_MIN),
        Just(1152usize),
        Just(2048usize),
        Just(4096usize),
        (17usize..=128).prop_map(|n| n * STRIDE_BYTES),
    ]
}

fn spec_strategy() -> impl Strategy<Value = Spec> {
    let kind = prop_oneof![
        6 => Just(Kind::Put),
        1 => Just(Kind::Del),
        1 => Just(Kind::Commit),
    ];
    let value_len = prop_oneof![0usize..200, 0usize..12_000];
    (
        kind,
        any::<u16>(),
        0u64..=Version::MAX.0,
        proptest::collection::vec(any::<u8>(), 0..=1024),
        value_len,
        any::<u8>(),
        mtu_strategy(),
    )
        .prop_map(
            |(kind, shard, version, mut key, value_len, seed, mtu_bytes)| {
                let mut value: Vec<u8> = (0..value_len)
                    .map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed))
                    .collect();
                match kind {
                    Kind::Put => {}
                    Kind::Del => value.clear(),
                    Kind::Commit => {
                        key.clear();
                        value.clear();
                    }
                }
                Spec {
                    kind,
                    shard: ShardId(shard),
                    version: Version(version),
                    key,
                    value,
                    mtu_bytes,
                }
            },
        )
}

/// Blocks of a contiguous encoded entry, as (header, payload).
fn blocks(bytes: &[u8]) -> Vec<(BlockHeader, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let (h, p) = parse_block(&bytes[offset..]).expect("valid block");
        out.push((h, p.to_vec()));
        offset += h.padded_len();
    }
    out
}

/// A header with arbitrary fields and a correct checksum over an arbitrary payload,
/// so that the field checks behind the checksum are exercised too.
fn checksummed_block(fields: &[u8; HEADER_BYTES], payload: &[u8], pad: usize) -> Vec<u8> {
    let mut b = fields.to_vec();
    b[0] = 1 + b[0] % 3;
    b[1] = 1;
    b[22..24].copy_from_slice(&(payload.len() as u16).to_le_bytes());
    b[4..8].fill(0);
    b.extend_from_slice(payload);
    let crc = crc32c::crc32c(&b);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b.resize(b.len() + pad, 0);
    b
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
        let block = parse_block(&bytes);
        if let Ok((h, payload)) = block {
            prop_assert!(h.padded_len() <= bytes.len());
            prop_assert_eq!(payload.len(), h.payload_len as usize);
        }
        if let Ok(e) = parse_entry(&bytes) {
            prop_assert!(e.encoded_len <= bytes.len());
        }
        let _ = read_key(&bytes);
    }

    #[test]
    fn checksummed_headers_never_panic(
        fields in any::<[u8; HEADER_BYTES]>(),
        payload in proptest::collection::vec(any::<u8>(), 0..2000),
        pad in 0usize..128,
        tail in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut bytes = checksummed_block(&fields, &payload, pad);
        bytes.extend_from_slice(&tail);
        if let Ok((h, p)) = parse_block(&bytes) {
            prop_assert_eq!(p, &payload[..]);
            prop_assert!(h.padded_len() <= bytes.len());
            let _ = Assembler::new().add(h, p);
        }
        if let Ok(e) = parse_entry(&bytes) {
            prop_assert!(e.encoded_len <= bytes.len());
            prop_assert!(e.key.len() <= payload.len());
        }
        let _ = read_key(&bytes);
    }

    #[test]
    fn resealed_headers_never_panic(
        spec in spec_strategy(),
        block in any::<prop::sample::Index>(),
        writes in proptest::collection::vec((0usize..HEADER_BYTES, any::<u8>(), 0u8..4), 1..4),
    ) {
        // A valid block whose header fields are rewritten and whose checksum is then
        // recomputed: a forgery that only the field checks can refuse.
        let mut bytes = spec.encode();
        let offsets: Vec<usize> = {
            let mut offsets = Vec::new();
            let mut offset = 0;
            for (h, _) in blocks(&bytes) {
                offsets.push(offset);
                offset += h.padded_len();
            }
            offsets
        };
        let start = offsets[block.index(offsets.len())];
        for (at, byte, how) in writes {
            let b = &mut bytes[start + at];
            // Small nudges reach the consistency checks more often than random bytes.
            *b = match how {
                0 => byte,
                1 => b.wrapping_add(1),
                2 => b.wrapping_sub(1),
                _ => *b ^ (1 << (byte % 8)),
            };
        }
        let payload_len = u16::from_le_bytes([bytes[start + 22], bytes[start + 23]]) as usize;
        let covered_end = (start + HEADER_BYTES + payload_len).min(bytes.len());
        bytes[start + 4..start + 8].fill(0);
        let crc = crc32c::crc32c(&bytes[start..covered_end]);
        bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        if let Ok((h, p)) = parse_block(&bytes[start..]) {
            let _ = Assembler::new().add(h, p);
        }
        if let Ok(e) = parse_entry(&bytes) {
            prop_assert!(e.encoded_len <= bytes.len());
        }
        let _ = read_key(&bytes);
        let _ = read_key(&bytes[start..]);
    }

    #[test]
    fn valid_entries_round_trip(spec in spec_strategy(), order_seed in any::<u64>()) {
        let bytes = spec.encode();
        prop_assert_eq!(bytes.len(), encoded_len(spec.key.len(), spec.value.len(), spec.mtu_bytes));
        prop_assert_eq!(bytes.len() % STRIDE_BYTES, 0);
        let e = parse_entry(&bytes).expect("round trip");
        prop_assert_eq!((e.kind, e.shard, e.version), (spec.kind, spec.shard, spec.version));
        prop_assert_eq!(e.key, &spec.key[..]);
        prop_assert_eq!(&e.value[..], &spec.value[..]);
        prop_assert_eq!(e.encoded_len, bytes.len());
        let (h, key) = read_key(&bytes).expect("key");
        prop_assert_eq!(key, &spec.key[..]);
        prop_assert_eq!(h.seq, 0);

        // Every block fits the MTU, all but the last are full, the first word is set.
        let all = blocks(&bytes);
        prop_assert_eq!(all.len(), h.cnt as usize);
        let mut offset = 0;
        for (i, (b, _)) in all.iter().enumerate() {
            prop_assert_eq!(b.seq as usize, i);
            prop_assert!(b.padded_len() <= spec.mtu_bytes);
            if i + 1 < all.len() {
                prop_assert_eq!(b.payload_len as usize, spec.mtu_bytes - HEADER_BYTES);
            }
            prop_assert!(bytes[offset..offset + 8].iter().any(|&x| x != 0));
            offset += b.padded_len();
        }

        // The Assembler gets the same entry from the blocks in any order.
        let mut shuffled = all.clone();
        let mut state = order_seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let mut asm = Assembler::new();
        let mut done = None;
        for (i, (b, p)) in shuffled.iter().enumerate() {
            let got = asm.add(*b, p).expect("valid block");
            prop_assert_eq!(got.is_some(), i + 1 == shuffled.len());
            done = got;
        }
        let done = done.expect("complete");
        prop_assert_eq!((done.kind, done.shard, done.version), (spec.kind, spec.shard, spec.version));
        prop_assert_eq!(&done.key, &spec.key);
        prop_assert_eq!(&done.value, &spec.value);
        prop_assert_eq!(asm.pending(), 0);
    }

    #[test]
    fn damaged_entries_never_decode_to_other_content(
        spec in spec_strategy(),
        writes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let original = spec.encode();
        let mut bytes = original.clone();
        for (at, byte) in &writes {
            bytes[at.index(original.len())] = *byte;
        }
        if let Some(at) = truncate {
            bytes.truncate(at.index(original.len()));
        }
        if let Ok(e) = parse_entry(&bytes) {
            prop_assert_eq!((e.kind, e.shard, e.version), (spec.kind, spec.shard, spec.version));
            prop_assert_eq!(e.key, &spec.key[..]);
            prop_assert_eq!(&e.value[..], &spec.value[..]);
            prop_assert_eq!(e.encoded_len, original.len());
        } else {
            // Only a change of covered bytes, or a truncation, may make it fail.
            prop_assert!(bytes != original);
        }
        if let Ok((h, key)) = read_key(&bytes) {
            prop_assert_eq!((h.kind, h.shard, h.version), (spec.kind, spec.shard, spec.version));
            prop_assert_eq!(key, &spec.key[..]);
        }
        let mut offset = 0;
        while let Some(rest) = bytes.get(offset..) {
            let Ok((h, _)) = parse_block(rest) else { break };
            prop_assert_eq!((h.kind, h.shard, h.version), (spec.kind, spec.shard, spec.version));
            offset += h.padded_len();
        }
    }

    #[test]
    fn assembler_fed_arbitrary_headers_never_panics(
        specs in proptest::collection::vec(spec_strategy(), 1..3),
        junk in proptest::collection::vec(
            (
                0u8..5, 0u16..3, 0u64..3, any::<u8>(), 0u8..4, 0u16..1100, 0u32..12_000,
                any::<u16>(), 0usize..4200, any::<bool>(),
            ),
            0..24,
        ),
        order in proptest::collection::vec(any::<prop::sample::Index>(), 0..64),
    ) {
        // Valid blocks, with shards and versions squeezed so that junk collides with them.
        let mut feed: Vec<(BlockHeader, Vec<u8>)> = Vec::new();
        for spec in &specs {
            let mut spec = spec.clone();
            spec.shard = ShardId(spec.shard.0 % 3);
            spec.version = Version(spec.version.0 % 3);
            feed.extend(blocks(&spec.encode()));
        }
        for (kind, shard, version, seq, cnt, key_len, value_len, payload_len, len, honest) in junk {
            let kind = match kind % 3 {
                0 => Kind::Put,
                1 => Kind::Del,
                _ => Kind::Commit,
            };
            let payload_len = if honest { len.min(u16::MAX as usize) as u16 } else { payload_len };
            feed.push((
                BlockHeader {
                    kind,
                    shard: ShardId(shard),
                    version: Version(version),
                    seq: seq % 5,
                    cnt,
                    key_len,
                    value_len,
                    payload_len,
                },
                vec![0xA5; len],
            ));
        }
        let mut asm = Assembler::new();
        let mut feed_in_order: Vec<usize> = order.iter().map(|i| i.index(feed.len())).collect();
        feed_in_order.extend(0..feed.len());
        for i in feed_in_order {
            let (h, p) = &feed[i];
            match asm.add(*h, p) {
                Ok(Some(e)) => {
                    prop_assert_eq!(e.key.len(), h.key_len as usize);
                    prop_assert_eq!(e.value.len(), h.value_len as usize);
                }
                Ok(None) => {}
                Err(EntryError::End) => prop_assert!(false, "add never reports End"),
                Err(_) => {}
            }
            prop_assert!(asm.pending() <= feed.len());
        }
    }
}
