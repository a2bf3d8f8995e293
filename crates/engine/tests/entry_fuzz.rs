//! Fuzzing of the log-entry decoders (`rowankv_engine::entry`) with proptest: they
//! take bytes from PM and the network, so they must never panic, and a damaged entry
//! must never decode to content other than what was written. Entries with and
//! without a request record (format version 2, format byte 3) and with and without
//! an expiry time (format version 3, format bit 4) are generated; an entry without
//! either is byte-identical to a format version 1 entry, a malformed record is
//! refused with a typed error, and so is every byte that is no format.

use proptest::prelude::*;
use proptest::test_runner::Config;
use rowankv_engine::entry::{
    decode_request, encode, encode_inner, encode_with_request, encoded_len, encoded_len_for,
    parse_block, parse_entry, read_key, Assembler, BlockHeader, EntryError, Kind,
    FORMAT_EXPIRY_BIT, FORMAT_REQUEST, FORMAT_V1, HEADER_BYTES, MTU_BYTES_MIN,
    REQUEST_RECORD_BYTES, STRIDE_BYTES,
};
use rowankv_types::{RequestId, RequestRecord, ShardId, Version};

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
    /// Only on a Put or Del.
    request: Option<RequestRecord>,
    /// Only on a Put.
    expires_at_ms: Option<u64>,
    mtu_bytes: usize,
}

impl Spec {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let cnt = match self.request {
            _ if self.expires_at_ms.is_some() => encode_inner(
                &mut out,
                self.kind,
                self.shard,
                self.version,
                &self.key,
                &self.value,
                self.request,
                self.expires_at_ms,
                self.mtu_bytes,
            ),
            None => encode(
                &mut out,
                self.kind,
                self.shard,
                self.version,
                &self.key,
                &self.value,
                self.mtu_bytes,
            ),
            Some(r) => encode_with_request(
                &mut out,
                self.kind,
                self.shard,
                self.version,
                &self.key,
                &self.value,
                r,
                self.mtu_bytes,
            ),
        }
        .expect("a valid spec encodes");
        assert!(cnt >= 1);
        out
    }
}

/// Format version 1, written from `docs/format/log-entry.md` independently of the
/// engine's encoder: what every entry without a request record must still be.
fn v1_reference_encode(spec: &Spec) -> Vec<u8> {
    assert!(spec.request.is_none() && spec.expires_at_ms.is_none());
    let capacity = spec.mtu_bytes - HEADER_BYTES;
    let stream: Vec<u8> = spec.key.iter().chain(&spec.value).copied().collect();
    let chunks: Vec<&[u8]> = if stream.is_empty() {
        vec![&[][..]]
    } else {
        stream.chunks(capacity).collect()
    };
    let mut out = Vec::new();
    for (seq, chunk) in chunks.iter().enumerate() {
        let mut b = vec![spec.kind as u8, 1];
        b.extend_from_slice(&spec.shard.0.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&spec.version.0.to_le_bytes()[..6]);
        b.push(seq as u8);
        b.push(chunks.len() as u8);
        b.extend_from_slice(&(spec.key.len() as u16).to_le_bytes());
        b.extend_from_slice(&(spec.value.len() as u32).to_le_bytes());
        b.extend_from_slice(&(chunk.len() as u16).to_le_bytes());
        b.extend_from_slice(chunk);
        let crc = crc32c::crc32c(&b);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b.resize(b.len().div_ceil(STRIDE_BYTES) * STRIDE_BYTES, 0);
        out.extend_from_slice(&b);
    }
    out
}

fn request_strategy() -> impl Strategy<Value = RequestRecord> {
    // Floors near their seq (stored exactly, across the 254 boundary) and anywhere
    // below it (stored as no floor).
    (1u64.., 0..RequestId::SEQ_LIMIT, any::<u64>(), any::<bool>()).prop_map(
        |(client, seq, back, near)| {
            let back = if near { back % 300 } else { back };
            RequestRecord {
                id: RequestId { client, seq },
                first_incomplete: seq - back % (seq + 1),
            }
        },
    )
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
        proptest::option::weighted(0.5, request_strategy()),
        proptest::option::weighted(0.3, any::<u64>()),
    )
        .prop_map(
            |(
                kind,
                shard,
                version,
                mut key,
                value_len,
                seed,
                mtu_bytes,
                mut request,
                mut expires_at_ms,
            )| {
                let mut value: Vec<u8> = (0..value_len)
                    .map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed))
                    .collect();
                match kind {
                    Kind::Put => {}
                    Kind::Del => {
                        value.clear();
                        expires_at_ms = None;
                    }
                    Kind::Commit => {
                        key.clear();
                        value.clear();
                        request = None;
                        expires_at_ms = None;
                    }
                }
                Spec {
                    kind,
                    shard: ShardId(shard),
                    version: Version(version),
                    key,
                    value,
                    request,
                    expires_at_ms,
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
    // Format 1, 3 (a request record expected at the start of block 0's payload),
    // or 2 (the refused pre-release layout).
    b[1] = 1 + b[1] % 3;
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
            prop_assert_eq!(e.request.is_some(), bytes[1] == FORMAT_REQUEST);
            if let Some(r) = e.request {
                prop_assert!(r.is_valid());
            }
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
        let has_request = spec.request.is_some();
        let has_expiry = spec.expires_at_ms.is_some();
        prop_assert_eq!(
            bytes.len(),
            encoded_len_for(spec.key.len(), spec.value.len(), has_request, has_expiry, spec.mtu_bytes)
        );
        if !has_request && !has_expiry {
            prop_assert_eq!(bytes.len(), encoded_len(spec.key.len(), spec.value.len(), spec.mtu_bytes));
        }
        prop_assert_eq!(bytes.len() % STRIDE_BYTES, 0);
        let e = parse_entry(&bytes).expect("round trip");
        prop_assert_eq!((e.kind, e.shard, e.version), (spec.kind, spec.shard, spec.version));
        prop_assert_eq!(e.request, spec.request.map(|r| r.as_logged()));
        prop_assert_eq!(e.expires_at_ms, spec.expires_at_ms);
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
            prop_assert_eq!(b.has_request, has_request);
            prop_assert_eq!(b.has_expiry, has_expiry);
            let format = if has_request { FORMAT_REQUEST } else { FORMAT_V1 }
                | if has_expiry { FORMAT_EXPIRY_BIT } else { 0 };
            prop_assert_eq!(bytes[offset + 1], format);
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
        prop_assert_eq!(done.request, spec.request.map(|r| r.as_logged()));
        prop_assert_eq!(done.expires_at_ms, spec.expires_at_ms);
        prop_assert_eq!(done.encoded_len(spec.mtu_bytes), bytes.len());
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
            prop_assert_eq!(e.request, spec.request.map(|r| r.as_logged()));
            prop_assert_eq!(e.expires_at_ms, spec.expires_at_ms);
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
                any::<u16>(), 0usize..4200, any::<bool>(), any::<bool>(),
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
        for (kind, shard, version, seq, cnt, key_len, value_len, payload_len, len, honest, has_request)
            in junk
        {
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
                    has_request,
                    has_expiry: seq & 0x80 != 0,
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
                    prop_assert_eq!(e.request.is_some(), h.has_request);
                }
                Ok(None) => {}
                Err(EntryError::End) => prop_assert!(false, "add never reports End"),
                Err(_) => {}
            }
            prop_assert!(asm.pending() <= feed.len());
        }
    }

    #[test]
    fn entries_without_a_record_are_format_1_bytes(spec in spec_strategy()) {
        let spec = Spec { request: None, expires_at_ms: None, ..spec };
        prop_assert_eq!(spec.encode(), v1_reference_encode(&spec));
    }

    #[test]
    fn malformed_records_are_refused_with_a_typed_error(
        spec in spec_strategy(),
        request in request_strategy(),
        client_zero in any::<bool>(),
        above in 1u64..1000,
    ) {
        // A valid entry with a record whose record bytes are then made malformed
        // (client 0, or a floor gap reaching below seq 0) and the block resealed:
        // only the record check can refuse it.
        let spec = Spec {
            kind: if spec.kind == Kind::Commit { Kind::Put } else { spec.kind },
            request: Some(request),
            expires_at_ms: None,
            ..spec
        };
        let mut bytes = spec.encode();
        let at = HEADER_BYTES;
        let logged = request.as_logged();
        let want = if client_zero {
            bytes[at..at + 8].fill(0);
            EntryError::BadRequest {
                client: 0,
                seq: logged.id.seq,
                first_incomplete: logged.first_incomplete,
            }
        } else {
            let seq = above % 200;
            let gap = (seq + 1 + above % 50) as u8;
            bytes[at + 8..at + 13].copy_from_slice(&seq.to_le_bytes()[..5]);
            bytes[at + 13] = gap;
            EntryError::BadFloorGap { seq, gap }
        };
        let (h, _) = blocks(&spec.encode())[0].clone();
        let covered_end = HEADER_BYTES + h.payload_len as usize;
        bytes[4..8].fill(0);
        let crc = crc32c::crc32c(&bytes[..covered_end]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        prop_assert_eq!(parse_block(&bytes).map(|_| ()), Err(want.clone()));
        prop_assert_eq!(parse_entry(&bytes).map(|_| ()), Err(want.clone()));
        prop_assert_eq!(read_key(&bytes).map(|_| ()), Err(want.clone()));
        prop_assert_eq!(
            decode_request(&bytes[at..at + REQUEST_RECORD_BYTES]),
            Err(want.clone())
        );
        // The assembler, handed the header and payload directly, refuses it too
        // and holds nothing.
        let payload = &bytes[HEADER_BYTES..covered_end];
        let mut asm = Assembler::new();
        prop_assert_eq!(asm.add(h, payload), Err(want));
        prop_assert_eq!(asm.pending(), 0);
        // And the encoder will not write a malformed record: client 0, a floor
        // above its seq, or a seq a log entry cannot hold.
        let bad = [
            RequestRecord { id: RequestId { client: 0, ..request.id }, ..request },
            RequestRecord { first_incomplete: request.id.seq + above, ..request },
            RequestRecord {
                id: RequestId { seq: RequestId::SEQ_LIMIT + above, ..request.id },
                first_incomplete: 0,
            },
        ];
        for bad in bad {
            let mut out = Vec::new();
            let refused = encode_with_request(
                &mut out,
                spec.kind,
                spec.shard,
                spec.version,
                &spec.key,
                &spec.value,
                bad,
                spec.mtu_bytes,
            );
            let is_bad_request = matches!(refused, Err(EntryError::BadRequest { .. }));
            prop_assert!(is_bad_request, "encoded a malformed record {:?}: {:?}", bad, refused);
        }
    }

    #[test]
    fn bytes_that_are_no_format_are_refused(
        spec in spec_strategy(),
        format in prop_oneof![Just(2u8), Just(0u8), Just(4u8), Just(6u8), 8u8..],
    ) {
        // Byte 2 was a 24 B-record layout that was never released; 0, 4, 6 and
        // everything above 7 are no format (formats are 1 plus flag bits 2 and
        // 4). A block that carries one is refused, never misread, even with a
        // valid checksum.
        let mut bytes = spec.encode();
        bytes[1] = format;
        let (h, _) = blocks(&spec.encode())[0].clone();
        let covered_end = HEADER_BYTES + h.payload_len as usize;
        bytes[4..8].fill(0);
        let crc = crc32c::crc32c(&bytes[..covered_end]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        prop_assert_eq!(parse_block(&bytes).map(|_| ()), Err(EntryError::BadFormat(format)));
        prop_assert_eq!(parse_entry(&bytes).map(|_| ()), Err(EntryError::BadFormat(format)));
    }

    #[test]
    fn an_expiry_time_on_a_del_or_commit_is_refused(
        spec in spec_strategy(),
        expires_at_ms in any::<u64>(),
    ) {
        // Neither the encoder writes one nor a decoder accepts one (a resealed
        // block claiming the flag).
        let kind = if spec.kind == Kind::Put { Kind::Del } else { spec.kind };
        let (key, request) = if kind == Kind::Commit {
            (Vec::new(), None)
        } else {
            (spec.key.clone(), spec.request)
        };
        let mut out = Vec::new();
        let refused = encode_inner(
            &mut out, kind, spec.shard, spec.version, &key, &[], request,
            Some(expires_at_ms), spec.mtu_bytes,
        );
        prop_assert!(matches!(refused, Err(EntryError::BadLength(_))), "{:?}", refused);
        let plain = Spec { kind, key, value: Vec::new(), request, expires_at_ms: None, ..spec };
        let mut bytes = plain.encode();
        bytes[1] |= FORMAT_EXPIRY_BIT;
        let (h, _) = blocks(&plain.encode())[0].clone();
        let covered_end = HEADER_BYTES + h.payload_len as usize;
        bytes[4..8].fill(0);
        let crc = crc32c::crc32c(&bytes[..covered_end]);
        bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        prop_assert!(parse_block(&bytes).is_err());
    }
}
