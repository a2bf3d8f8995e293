//! RPC frames: round trips, the byte layout, every decoding error, and fuzzing of the
//! decoder with arbitrary, truncated and mutated input.

use proptest::prelude::*;
use rowankv_types::{NodeId, RequestId, RequestRecord, ShardId, Term};
use rowankv_wire::frame::{
    decode, decode_header, encode, encode_load_entries, encode_outcomes, load_entries, outcomes_in,
    put_value_bytes_max, value_response_bytes_max, Body, Envelope, ErrorCode, Expect, FrameError,
    MsgType, Response, FRAME_BYTES_MAX_DEFAULT, HEADER_BYTES, KEY_BYTES_MAX, LOAD_ENTRY_BYTES,
    MAGIC, MIGRATE_FIXED_BYTES, MIGRATE_OUTCOME_BYTES, WIRE_VERSION,
};

const MAX: usize = FRAME_BYTES_MAX_DEFAULT;

fn env() -> Envelope {
    Envelope {
        cluster_id: 0xC1A5_7E20_0000_0001,
        term: Term(7),
        request_id: 0x0102_0304_0506_0708,
        sender: NodeId(3),
    }
}

fn encoded(body: &Body<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let len = encode(&mut out, &env(), body, MAX).expect("encode");
    assert_eq!(len, out.len());
    out
}

/// No request record: the 24 zero bytes a Put or Del body starts with.
const NO_REQUEST: [u8; 24] = [0; 24];

/// `NO_REQUEST` then `rest`: a hand-built Put or Del body.
fn write_body(rest: &[u8]) -> Vec<u8> {
    let mut b = NO_REQUEST.to_vec();
    b.extend_from_slice(rest);
    b
}

/// A frame built by hand, independently of the encoder: the header layout spelled out.
fn raw_frame(msg_type: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(b"RK");
    f.push(4); // version
    f.push(msg_type);
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(&11u64.to_le_bytes()); // cluster_id
    f.extend_from_slice(&5u64.to_le_bytes()); // term
    f.extend_from_slice(&99u64.to_le_bytes()); // request_id
    f.extend_from_slice(&2u32.to_le_bytes()); // sender
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(body);
    f
}

fn error_body(code: u8, detail: &[u8]) -> Vec<u8> {
    let mut b = vec![4, code];
    b.extend_from_slice(&9u64.to_le_bytes());
    b.extend_from_slice(&(detail.len() as u16).to_le_bytes());
    b.extend_from_slice(detail);
    b
}

fn entries(blocks: usize) -> Vec<u8> {
    (0..blocks * 64).map(|i| i as u8).collect()
}

/// One body of every variant and every response status.
fn samples(entries: &[u8]) -> Vec<Body<'_>> {
    vec![
        Body::Get { key: b"user:42" },
        Body::Get { key: b"" },
        Body::Put {
            expires_at_ms: None,
            key: b"user:42",
            value: b"hello, world",
            request: None,
        },
        Body::Put {
            expires_at_ms: None,
            key: b"",
            value: b"",
            request: None,
        },
        Body::Del {
            key: b"user:42",
            request: None,
        },
        Body::Put {
            expires_at_ms: None,
            key: b"user:42",
            value: b"once",
            request: Some(RequestRecord {
                id: RequestId {
                    client: 0xfeed_beef,
                    seq: 17,
                },
                first_incomplete: 12,
            }),
        },
        Body::Del {
            key: b"user:42",
            request: Some(RequestRecord {
                id: RequestId {
                    client: u64::MAX,
                    seq: RequestId::SEQ_LIMIT - 1,
                },
                first_incomplete: RequestId::SEQ_LIMIT - 1,
            }),
        },
        Body::Replicate { entries },
        Body::GrantSegment {
            log: 3,
            sealed: None,
        },
        Body::GrantSegment {
            log: u32::MAX,
            sealed: Some(17),
        },
        Body::GrantSegment {
            log: 0,
            sealed: Some(0),
        },
        Body::PutIf {
            expires_at_ms: None,
            key: b"counter",
            value: b"41",
            request: None,
            expect: Expect::Version(7),
        },
        Body::PutIf {
            expires_at_ms: Some(0),
            key: b"lock",
            value: b"me",
            request: None,
            expect: Expect::Absent,
        },
        Body::Put {
            expires_at_ms: Some(u64::MAX),
            key: b"session:9",
            value: b"token",
            request: None,
        },
        Body::PutIf {
            expires_at_ms: None,
            key: b"k",
            value: b"",
            request: None,
            expect: Expect::Absent,
        },
        Body::DelIf {
            key: b"k",
            request: None,
            expect: Expect::Version(u64::MAX),
        },
        Body::Ping,
        Body::Lease,
        Body::Stats,
        Body::Prepare { term: Term(9) },
        Body::Commit {
            term: Term(u64::MAX),
        },
        Body::Gather {
            shard: ShardId(7),
            cursor: 1234,
        },
        Body::Install {
            shard: ShardId(u16::MAX),
            entries,
        },
        Body::Ready {
            shard: ShardId(3),
            node: NodeId(2),
        },
        Body::Config { offset: 4000 },
        Body::Response(Response::Config {
            term: Term(9),
            total: 12_345,
            chunk: b"{\"term\":9}",
        }),
        Body::Response(Response::Config {
            term: Term(1),
            total: 0,
            chunk: &[],
        }),
        Body::Response(Response::Entries {
            next: 17,
            more: true,
            entries,
        }),
        Body::Response(Response::Entries {
            next: 0,
            more: false,
            entries: &[],
        }),
        Body::Response(Response::Ok { version: 1 << 40 }),
        Body::Response(Response::Value {
            expires_at_ms: None,
            version: 12,
            value: b"payload",
        }),
        Body::Response(Response::Value {
            expires_at_ms: Some(1_767_225_600_000),
            version: 13,
            value: b"until new year",
        }),
        Body::Response(Response::Value {
            expires_at_ms: None,
            version: 0,
            value: b"",
        }),
        Body::Response(Response::NotFound),
        Body::Response(Response::Segment {
            segment: 9,
            offset: 4 << 20,
            len_bytes: 4 << 20,
        }),
        Body::Response(Response::Error {
            code: ErrorCode::StaleTerm,
            term: Term(8),
            detail: "request term t7 is older than the server's t8",
        }),
        Body::Response(Response::Error {
            code: ErrorCode::Internal,
            term: Term(0),
            detail: "",
        }),
    ]
}

#[test]
fn every_body_and_response_round_trips() {
    let entries = entries(3);
    for body in samples(&entries) {
        let bytes = encoded(&body);
        let frame = decode(&bytes).unwrap_or_else(|e| panic!("{body:?}: {e}"));
        assert_eq!(frame.body, body);
        assert_eq!(frame.header.msg_type, body.msg_type() as u8);
        assert_eq!(frame.header.body_len as usize, bytes.len() - HEADER_BYTES);
        assert_eq!(frame.header.frame_bytes(), bytes.len());
        assert_eq!(frame.header.cluster_id, env().cluster_id);
        assert_eq!(frame.header.term, env().term);
        assert_eq!(frame.header.request_id, env().request_id);
        assert_eq!(frame.header.sender, env().sender);
        assert_eq!(decode_header(&bytes), Ok(frame.header));
    }
}

#[test]
fn every_error_code_round_trips() {
    for b in 1..=15 {
        let code = ErrorCode::from_u8(b).expect("codes 1..=15 exist");
        let body = Body::Response(Response::Error {
            code,
            term: Term(3),
            detail: "détail ✓",
        });
        assert_eq!(decode(&encoded(&body)).unwrap().body, body);
        assert!(!code.to_string().is_empty());
    }
    assert_eq!(ErrorCode::from_u8(0), None);
    assert_eq!(ErrorCode::from_u8(16), None);
}

#[test]
fn msg_types_map_to_their_bytes() {
    let all = [
        (MsgType::Get, 1),
        (MsgType::Put, 2),
        (MsgType::Del, 3),
        (MsgType::Replicate, 4),
        (MsgType::GrantSegment, 5),
        (MsgType::Ping, 6),
        (MsgType::Lease, 7),
        (MsgType::Prepare, 8),
        (MsgType::Commit, 9),
        (MsgType::Gather, 10),
        (MsgType::Install, 11),
        (MsgType::Ready, 12),
        (MsgType::Config, 13),
        (MsgType::Stats, 14),
        (MsgType::PutIf, 15),
        (MsgType::DelIf, 16),
        (MsgType::Scan, 17),
        (MsgType::Load, 18),
        (MsgType::Migrate, 19),
        (MsgType::GetMigrating, 20),
        (MsgType::Reshard, 21),
        (MsgType::Response, 0x80),
    ];
    for (t, b) in all {
        assert_eq!(t as u8, b);
        assert_eq!(MsgType::from_u8(b), Some(t));
    }
    assert_eq!(MsgType::from_u8(0), None);
    assert_eq!(MsgType::from_u8(22), None);
    assert_eq!(MsgType::from_u8(0x81), None);
}

#[test]
fn put_frame_has_the_documented_layout() {
    let bytes = encoded(&Body::Put {
        expires_at_ms: None,
        key: b"ab",
        value: b"xyz",
        request: None,
    });
    let mut expected = Vec::new();
    expected.extend_from_slice(&MAGIC);
    expected.push(WIRE_VERSION);
    expected.push(2);
    expected.extend_from_slice(&44u32.to_le_bytes()); // 24 + 9 + 2 + 4 + 2 + 3
    expected.extend_from_slice(&0xC1A5_7E20_0000_0001u64.to_le_bytes());
    expected.extend_from_slice(&7u64.to_le_bytes());
    expected.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
    expected.extend_from_slice(&3u32.to_le_bytes());
    expected.extend_from_slice(&[0; 4]);
    expected.extend_from_slice(&[0; 24]); // no request record
    expected.extend_from_slice(&[0; 9]); // no expiry
    expected.extend_from_slice(&2u16.to_le_bytes());
    expected.extend_from_slice(&3u32.to_le_bytes());
    expected.extend_from_slice(b"ab");
    expected.extend_from_slice(b"xyz");
    assert_eq!(bytes, expected);
}

#[test]
fn grant_segment_and_error_have_the_documented_layout() {
    let bytes = encoded(&Body::GrantSegment {
        log: 0x0A0B_0C0D,
        sealed: Some(6),
    });
    assert_eq!(
        &bytes[HEADER_BYTES..],
        &[0x0D, 0x0C, 0x0B, 0x0A, 1, 6, 0, 0, 0]
    );

    let bytes = encoded(&Body::GrantSegment {
        log: 1,
        sealed: None,
    });
    assert_eq!(&bytes[HEADER_BYTES..], &[1, 0, 0, 0, 0, 0, 0, 0, 0]);

    let bytes = encoded(&Body::Response(Response::Error {
        code: ErrorCode::Busy,
        term: Term(9),
        detail: "hi",
    }));
    assert_eq!(&bytes[HEADER_BYTES..], &error_body(6, b"hi")[..]);
}

#[test]
fn hand_built_frames_decode() {
    let bytes = raw_frame(3, &write_body(&[1, 0, b'k']));
    let frame = decode(&bytes).unwrap();
    assert_eq!(
        frame.body,
        Body::Del {
            key: b"k",
            request: None
        }
    );
    assert_eq!(frame.header.cluster_id, 11);
    assert_eq!(frame.header.term, Term(5));
    assert_eq!(frame.header.request_id, 99);
    assert_eq!(frame.header.sender, NodeId(2));
    assert_eq!(decode(&raw_frame(6, &[])).unwrap().body, Body::Ping);
}

#[test]
fn encode_reuses_the_buffer_it_is_given() {
    let mut out = Vec::with_capacity(MAX);
    out.extend_from_slice(b"stale bytes from the previous frame");
    let ptr = out.as_ptr();
    let value = vec![7u8; put_value_bytes_max(8, MAX)];
    let len = encode(
        &mut out,
        &env(),
        &Body::Put {
            expires_at_ms: None,
            key: b"12345678",
            value: &value,
            request: None,
        },
        MAX,
    )
    .unwrap();
    assert_eq!(len, MAX);
    assert_eq!(out.len(), MAX);
    assert_eq!(
        out.as_ptr(),
        ptr,
        "encode reallocated a buffer with enough capacity"
    );
    assert_eq!(out.capacity(), MAX);
}

// ---- decoding errors, one by one ----

#[test]
fn short_header_is_truncated() {
    let bytes = encoded(&Body::Ping);
    assert_eq!(
        decode(&bytes[..39]),
        Err(FrameError::Truncated { need: 40, have: 39 })
    );
    assert_eq!(
        decode_header(&[]),
        Err(FrameError::Truncated { need: 40, have: 0 })
    );
}

#[test]
fn bad_magic_is_rejected() {
    let mut bytes = encoded(&Body::Ping);
    bytes[0] = b'X';
    assert_eq!(decode(&bytes), Err(FrameError::BadMagic([b'X', b'K'])));
    assert_eq!(
        decode_header(&bytes),
        Err(FrameError::BadMagic([b'X', b'K']))
    );
}

#[test]
fn bad_version_is_rejected() {
    let mut bytes = encoded(&Body::Ping);
    // Version 1 (writes without request records), 2 (grant requests naming a
    // worker's log) and 3 (writes without expiry times) are no longer spoken;
    // 5 is not yet.
    for old in [1, 2, 3, 5] {
        bytes[2] = old;
        assert_eq!(decode(&bytes), Err(FrameError::BadVersion(old)));
    }
}

#[test]
fn non_zero_reserved_bytes_are_rejected() {
    for i in 36..40 {
        let mut bytes = encoded(&Body::Ping);
        bytes[i] = 1;
        assert_eq!(decode(&bytes), Err(FrameError::ReservedNonZero));
    }
}

#[test]
fn unknown_type_is_rejected_but_its_header_still_decodes() {
    let bytes = raw_frame(0x42, &[]);
    assert_eq!(decode(&bytes), Err(FrameError::UnknownType(0x42)));
    let header = decode_header(&bytes).unwrap();
    assert_eq!(header.msg_type, 0x42);
    assert_eq!(header.request_id, 99);
}

#[test]
fn body_length_mismatch_is_rejected() {
    let mut bytes = encoded(&Body::Get { key: b"abc" });
    bytes.push(0);
    assert_eq!(
        decode(&bytes),
        Err(FrameError::BodyLength {
            declared: 5,
            actual: 6
        })
    );
    bytes.truncate(bytes.len() - 2);
    assert_eq!(
        decode(&bytes),
        Err(FrameError::BodyLength {
            declared: 5,
            actual: 4
        })
    );
}

#[test]
fn trailing_bytes_in_a_body_are_rejected() {
    assert_eq!(
        decode(&raw_frame(1, &[1, 0, b'k', b'!'])),
        Err(FrameError::TrailingBytes(1))
    );
    assert_eq!(
        decode(&raw_frame(6, &[0, 0])),
        Err(FrameError::TrailingBytes(2))
    );
    assert_eq!(
        decode(&raw_frame(14, &[7])),
        Err(FrameError::TrailingBytes(1))
    );
    assert_eq!(decode(&raw_frame(14, &[])).unwrap().body, Body::Stats);
    // A condition is tag 1 with version 0 (absent) or tag 2 with a version.
    let del = |tag: u8, v: u64| {
        let mut b = vec![tag];
        b.extend_from_slice(&v.to_le_bytes());
        b.extend_from_slice(&[0; 24]); // no request record
        b.extend_from_slice(&[1, 0, b'k']);
        decode(&raw_frame(16, &b)).map(|f| match f.body {
            Body::DelIf { expect, .. } => expect,
            other => panic!("{other:?}"),
        })
    };
    assert_eq!(del(1, 0), Ok(Expect::Absent));
    assert_eq!(del(2, 9), Ok(Expect::Version(9)));
    for (tag, v) in [(0, 0), (1, 5), (2, 0), (3, 1)] {
        let e = del(tag, v).unwrap_err();
        assert!(
            e.to_string().contains("a condition of tag"),
            "{tag} {v}: {e}"
        );
    }
    assert!(
        del(2, 9).is_ok() && decode(&raw_frame(16, &[2, 9])).is_err(),
        "truncated"
    );
    // The encoder refuses what the decoder would.
    let zero = Body::DelIf {
        key: b"k",
        request: None,
        expect: Expect::Version(0),
    };
    let e = encode(&mut Vec::new(), &env(), &zero, MAX).unwrap_err();
    assert!(e.to_string().contains("version 0"), "{e}");
    // No request record (the 24 B write_body puts first), no expiry, key, value.
    let mut put = write_body(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, b'k', b'v']);
    put.extend_from_slice(b"extra");
    assert_eq!(
        decode(&raw_frame(2, &put)),
        Err(FrameError::TrailingBytes(5))
    );
    assert_eq!(
        decode(&raw_frame(0x80, &[2, 0])),
        Err(FrameError::TrailingBytes(1))
    );
    let mut ok = vec![0];
    ok.extend_from_slice(&[0; 9]);
    assert_eq!(
        decode(&raw_frame(0x80, &ok)),
        Err(FrameError::TrailingBytes(1))
    );
}

#[test]
fn lengths_pointing_past_the_end_are_rejected() {
    // Get: key_len 5, 2 key bytes present.
    let err = decode(&raw_frame(1, &[5, 0, b'a', b'b'])).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // Get: key_len itself cut short.
    let err = decode(&raw_frame(1, &[5])).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // Put: value_len u32::MAX.
    let mut put = write_body(&[1, 0]);
    put.extend_from_slice(&u32::MAX.to_le_bytes());
    put.push(b'k');
    let err = decode(&raw_frame(2, &put)).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // Value response: value_len 10, 1 byte present.
    let mut value = vec![1];
    value.extend_from_slice(&0u64.to_le_bytes());
    value.extend_from_slice(&10u32.to_le_bytes());
    value.push(0);
    let err = decode(&raw_frame(0x80, &value)).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // Error response: detail_len past the end.
    let mut error = error_body(1, b"abc");
    error.truncate(error.len() - 1);
    let err = decode(&raw_frame(0x80, &error)).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // Response without a status.
    let err = decode(&raw_frame(0x80, &[])).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // GrantSegment short by one byte.
    let err = decode(&raw_frame(5, &[0; 8])).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
}

#[test]
fn oversized_key_is_rejected_on_both_sides() {
    let key = vec![b'k'; KEY_BYTES_MAX + 1];
    let mut body = ((KEY_BYTES_MAX + 1) as u16).to_le_bytes().to_vec();
    body.extend_from_slice(&key);
    assert_eq!(
        decode(&raw_frame(1, &body)),
        Err(FrameError::KeyTooLarge {
            len: KEY_BYTES_MAX + 1
        })
    );
    // The declared length alone is refused, before looking for the bytes.
    assert_eq!(
        decode(&raw_frame(3, &write_body(&u16::MAX.to_le_bytes()))),
        Err(FrameError::KeyTooLarge {
            len: u16::MAX as usize
        })
    );
    let mut out = Vec::new();
    for body in [
        Body::Get { key: &key },
        Body::Del {
            key: &key,
            request: None,
        },
        Body::Put {
            expires_at_ms: None,
            key: &key,
            value: b"",
            request: None,
        },
    ] {
        assert_eq!(
            encode(&mut out, &env(), &body, MAX),
            Err(FrameError::KeyTooLarge {
                len: KEY_BYTES_MAX + 1
            })
        );
        assert!(out.is_empty());
    }
    // The longest key is fine.
    let key = vec![b'k'; KEY_BYTES_MAX];
    let body = Body::Get { key: &key };
    assert_eq!(decode(&encoded(&body)).unwrap().body, body);
}

#[test]
fn bad_utf8_in_detail_is_rejected() {
    assert_eq!(
        decode(&raw_frame(0x80, &error_body(4, &[b'o', 0xFF, b'k']))),
        Err(FrameError::BadUtf8)
    );
}

#[test]
fn scan_and_its_keys_round_trip_and_bad_keys_are_refused() {
    let scan = Body::Scan {
        shard: ShardId(3),
        cursor: u64::MAX,
        count: 100,
    };
    assert_eq!(decode(&encoded(&scan)).unwrap().body, scan);
    let mut keys = Vec::new();
    for k in [&b"a"[..], b"key:\x00\xff", &[7u8; KEY_BYTES_MAX][..]] {
        rowankv_wire::frame::put_key(&mut keys, k);
    }
    let body = Body::Response(Response::Keys {
        next: 42,
        keys: &keys,
    });
    let bytes = encoded(&body);
    let f = decode(&bytes).unwrap();
    assert_eq!(f.body, body);
    let Body::Response(Response::Keys { keys: got, .. }) = f.body else {
        unreachable!()
    };
    let listed: Vec<&[u8]> = rowankv_wire::frame::keys_in(got).collect();
    assert_eq!(listed.len(), 3);
    assert_eq!(listed[1], b"key:\x00\xff");
    // A truncated key, an empty one, one over the limit: refused.
    let response = |rest: &[u8]| {
        let mut b = vec![7u8];
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(rest);
        decode(&raw_frame(0x80, &b)).map(|_| ())
    };
    assert!(response(&[]).is_ok(), "no keys");
    for bad in [&[5u8, 0, b'a'][..], &[0, 0], &[1]] {
        assert!(response(bad).is_err(), "{bad:?}");
    }
    let mut long = ((KEY_BYTES_MAX + 1) as u16).to_le_bytes().to_vec();
    long.extend(std::iter::repeat_n(1u8, KEY_BYTES_MAX + 1));
    assert!(response(&long).is_err());
    assert!(
        decode(&raw_frame(17, &[0; 13])).is_err(),
        "a scan body of 13 bytes"
    );
}

#[test]
fn unknown_status_is_rejected() {
    for status in [8u8, 0x7F, 0xFF] {
        assert_eq!(
            decode(&raw_frame(0x80, &[status])),
            Err(FrameError::BadStatus(status))
        );
    }
}

#[test]
fn unknown_error_code_is_rejected() {
    for code in [0u8, 16, 0xFF] {
        assert_eq!(
            decode(&raw_frame(0x80, &error_body(code, b""))),
            Err(FrameError::BadErrorCode(code))
        );
    }
}

#[test]
fn bad_grant_segment_flags_are_rejected() {
    let mut body = 1u32.to_le_bytes().to_vec();
    body.push(2);
    body.extend_from_slice(&0u32.to_le_bytes());
    let err = decode(&raw_frame(5, &body)).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");

    // A sealed segment without has_sealed is not canonical.
    let mut body = 1u32.to_le_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&4u32.to_le_bytes());
    let err = decode(&raw_frame(5, &body)).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
}

#[test]
fn misaligned_or_empty_replicate_is_rejected_on_both_sides() {
    for len in [0usize, 1, 63, 65, 127] {
        let entries = vec![0u8; len];
        let err = decode(&raw_frame(4, &entries)).unwrap_err();
        assert!(matches!(err, FrameError::FieldLength(_)), "{len}: {err:?}");
        let err = encode(
            &mut Vec::new(),
            &env(),
            &Body::Replicate { entries: &entries },
            MAX,
        )
        .unwrap_err();
        assert!(matches!(err, FrameError::FieldLength(_)), "{len}: {err:?}");
    }
}

#[test]
fn detail_over_u16_is_refused_by_encode() {
    let detail = "x".repeat(u16::MAX as usize + 1);
    let body = Body::Response(Response::Error {
        code: ErrorCode::Internal,
        term: Term(1),
        detail: &detail,
    });
    let err = encode(&mut Vec::new(), &env(), &body, usize::MAX).unwrap_err();
    assert!(matches!(err, FrameError::FieldLength(_)), "{err:?}");
    // Just under the field's limit is fine when the frame is big enough.
    let detail = "x".repeat(u16::MAX as usize);
    let body = Body::Response(Response::Error {
        code: ErrorCode::Internal,
        term: Term(1),
        detail: &detail,
    });
    let mut out = Vec::new();
    encode(&mut out, &env(), &body, usize::MAX).unwrap();
    assert_eq!(decode(&out).unwrap().body, body);
}

#[test]
fn too_large_frames_are_refused_by_encode() {
    let value = vec![0u8; MAX];
    let mut out = Vec::new();
    assert_eq!(
        encode(
            &mut out,
            &env(),
            &Body::Put {
                expires_at_ms: None,
                key: b"k",
                value: &value,
                request: None,
            },
            MAX
        ),
        Err(FrameError::TooLarge {
            len: HEADER_BYTES + 39 + 1 + MAX,
            max: MAX
        })
    );
    assert!(out.is_empty());
    let entries = entries(MAX / 64);
    let err = encode(
        &mut out,
        &env(),
        &Body::Replicate { entries: &entries },
        MAX,
    )
    .unwrap_err();
    assert!(matches!(err, FrameError::TooLarge { .. }), "{err:?}");
    // A frame limit below the header refuses even a Ping.
    assert_eq!(
        encode(&mut out, &env(), &Body::Ping, HEADER_BYTES - 1),
        Err(FrameError::TooLarge {
            len: HEADER_BYTES,
            max: HEADER_BYTES - 1
        })
    );
}

#[test]
fn put_value_bytes_max_is_an_exact_boundary() {
    for frame_bytes_max in [MAX, 1500, 64 << 10] {
        for key_len in [0, 1, 100, KEY_BYTES_MAX] {
            let key = vec![b'k'; key_len];
            let max = put_value_bytes_max(key_len, frame_bytes_max);
            let value = vec![b'v'; max + 1];
            let mut out = Vec::new();
            let fits = Body::Put {
                expires_at_ms: None,
                key: &key,
                value: &value[..max],
                request: None,
            };
            assert_eq!(
                encode(&mut out, &env(), &fits, frame_bytes_max),
                Ok(frame_bytes_max)
            );
            assert_eq!(decode(&out).unwrap().body, fits);
            let one_more = Body::Put {
                expires_at_ms: None,
                key: &key,
                value: &value,
                request: None,
            };
            assert_eq!(
                encode(&mut out, &env(), &one_more, frame_bytes_max),
                Err(FrameError::TooLarge {
                    len: frame_bytes_max + 1,
                    max: frame_bytes_max
                })
            );
        }
    }
    assert_eq!(put_value_bytes_max(KEY_BYTES_MAX + 1, MAX), 0);
    assert_eq!(put_value_bytes_max(0, 10), 0);
}

#[test]
fn value_response_bytes_max_is_an_exact_boundary() {
    let max = value_response_bytes_max(MAX);
    let value = vec![1u8; max + 1];
    let mut out = Vec::new();
    let fits = Body::Response(Response::Value {
        expires_at_ms: None,
        version: 5,
        value: &value[..max],
    });
    assert_eq!(encode(&mut out, &env(), &fits, MAX), Ok(MAX));
    let one_more = Body::Response(Response::Value {
        expires_at_ms: None,
        version: 5,
        value: &value,
    });
    assert!(matches!(
        encode(&mut out, &env(), &one_more, MAX),
        Err(FrameError::TooLarge { .. })
    ));
    assert_eq!(value_response_bytes_max(10), 0);
}

#[test]
fn frame_errors_map_to_the_code_a_server_answers() {
    let cases = [
        (FrameError::UnknownType(9), ErrorCode::UnknownType),
        (
            FrameError::TooLarge {
                len: 5000,
                max: 4096,
            },
            ErrorCode::TooLarge,
        ),
        (FrameError::KeyTooLarge { len: 2000 }, ErrorCode::TooLarge),
        (
            FrameError::Truncated { need: 40, have: 3 },
            ErrorCode::Malformed,
        ),
        (FrameError::BadMagic(*b"XX"), ErrorCode::Malformed),
        (FrameError::BadVersion(9), ErrorCode::Malformed),
        (FrameError::ReservedNonZero, ErrorCode::Malformed),
        (
            FrameError::BodyLength {
                declared: 1,
                actual: 2,
            },
            ErrorCode::Malformed,
        ),
        (FrameError::FieldLength("x".into()), ErrorCode::Malformed),
        (FrameError::TrailingBytes(1), ErrorCode::Malformed),
        (FrameError::BadErrorCode(0), ErrorCode::Malformed),
        (FrameError::BadStatus(9), ErrorCode::Malformed),
        (FrameError::BadUtf8, ErrorCode::Malformed),
    ];
    for (err, code) in cases {
        assert_eq!(err.code(), code, "{err:?}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn error_messages_name_what_is_wrong() {
    assert_eq!(
        FrameError::BodyLength {
            declared: 5,
            actual: 6
        }
        .to_string(),
        "header declares a 5-byte body but 6 bytes follow the header"
    );
    assert_eq!(
        FrameError::KeyTooLarge { len: 1025 }.to_string(),
        "key of 1025 bytes exceeds the 1024-byte limit"
    );
    assert_eq!(
        FrameError::UnknownType(0x42).to_string(),
        "unknown message type 0x42"
    );
    assert_eq!(
        FrameError::TooLarge {
            len: 4097,
            max: 4096
        }
        .to_string(),
        "frame of 4097 bytes exceeds the 4096-byte frame limit"
    );
}

#[test]
fn every_truncation_of_every_sample_is_an_error() {
    let entries = entries(2);
    for body in samples(&entries) {
        let bytes = encoded(&body);
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "{body:?} truncated to {len} bytes decoded"
            );
        }
    }
}

// ---- property tests ----

fn envelope() -> impl Strategy<Value = Envelope> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
        |(cluster_id, term, request_id, sender)| Envelope {
            cluster_id,
            term: Term(term),
            request_id,
            sender: NodeId(sender),
        },
    )
}

/// A key within limits and a value that fits beside it in a default frame.
fn key_and_value() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    proptest::collection::vec(any::<u8>(), 0..=KEY_BYTES_MAX).prop_flat_map(|key| {
        let value_max = put_value_bytes_max(key.len(), MAX);
        (
            Just(key),
            proptest::collection::vec(any::<u8>(), 0..=value_max),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn put_get_del_round_trip(env in envelope(), (key, value) in key_and_value()) {
        let mut out = Vec::new();
        for body in [
            Body::Put { key: &key, value: &value, request: None, expires_at_ms: None },
            Body::Get { key: &key },
            Body::Del { key: &key, request: None },
        ] {
            encode(&mut out, &env, &body, MAX).unwrap();
            let frame = decode(&out).unwrap();
            prop_assert_eq!(frame.body, body);
            prop_assert_eq!(frame.header.term, env.term);
            prop_assert_eq!(frame.header.request_id, env.request_id);
            prop_assert_eq!(frame.header.sender, env.sender);
            prop_assert_eq!(frame.header.cluster_id, env.cluster_id);
        }
    }

    #[test]
    fn responses_round_trip(
        env in envelope(),
        version in any::<u64>(),
        value in proptest::collection::vec(any::<u8>(), 0..=value_response_bytes_max(MAX)),
        code in 1u8..=10,
        term in any::<u64>(),
        detail in "\\PC{0,200}",
        segment in any::<u32>(),
        offset in any::<u64>(),
        len_bytes in any::<u64>(),
    ) {
        let code = ErrorCode::from_u8(code).unwrap();
        let mut out = Vec::new();
        for response in [
            Response::Ok { version },
            Response::Value { version, value: &value, expires_at_ms: None },
            Response::NotFound,
            Response::Segment { segment, offset, len_bytes },
            Response::Error { code, term: Term(term), detail: &detail },
        ] {
            let body = Body::Response(response);
            encode(&mut out, &env, &body, MAX).unwrap();
            prop_assert_eq!(decode(&out).unwrap().body, body);
        }
    }

    #[test]
    fn control_bodies_round_trip(
        env in envelope(),
        blocks in 1usize..=(MAX - HEADER_BYTES) / 64,
        log in any::<u32>(),
        sealed in proptest::option::of(any::<u32>()),
    ) {
        let entries = entries(blocks);
        let mut out = Vec::new();
        for body in [
            Body::Replicate { entries: &entries },
            Body::GrantSegment { log, sealed },
            Body::Ping,
            Body::Lease,
            Body::Prepare { term: Term(log as u64) },
            Body::Commit { term: Term(log as u64 + 1) },
            Body::Gather { shard: ShardId(blocks as u16), cursor: log },
            Body::Install { shard: ShardId(log as u16), entries: &entries },
            Body::Ready { shard: ShardId(blocks as u16), node: NodeId(log) },
            Body::Reshard { shard: ShardId(log as u16), to: NodeId(log ^ 1) },
            Body::Response(Response::Entries { next: log, more: sealed.is_some(), entries: &entries }),
            Body::Config { offset: log },
            Body::Response(Response::Config { term: Term(log as u64), total: log, chunk: &entries }),
        ] {
            encode(&mut out, &env, &body, MAX).unwrap();
            prop_assert_eq!(decode(&out).unwrap().body, body);
        }
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let _ = decode(&bytes);
        let _ = decode_header(&bytes);
    }

    /// A valid header over an arbitrary body exercises every body parser.
    #[test]
    fn decode_never_panics_on_arbitrary_bodies(
        msg_type in prop_oneof![1u8..=12, Just(0x80u8), any::<u8>()],
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        if let Ok(frame) = decode(&raw_frame(msg_type, &body)) {
            // Whatever decodes must re-encode to the same body bytes (canonical form).
            let mut out = Vec::new();
            encode(&mut out, &env(), &frame.body, usize::MAX).unwrap();
            prop_assert_eq!(&out[HEADER_BYTES..], &body[..]);
        }
    }

    #[test]
    fn truncations_of_valid_frames_are_errors(
        env in envelope(),
        (key, value) in key_and_value(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut out = Vec::new();
        encode(&mut out, &env, &Body::Put { key: &key, value: &value, request: None, expires_at_ms: None }, MAX).unwrap();
        let len = cut.index(out.len());
        prop_assert!(decode(&out[..len]).is_err());
    }

    #[test]
    fn mutated_frames_never_panic(
        (key, value) in key_and_value(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut out = Vec::new();
        encode(&mut out, &env(), &Body::Put { key: &key, value: &value, request: None, expires_at_ms: None }, MAX).unwrap();
        for (at, byte) in flips {
            let i = at.index(out.len());
            out[i] = byte;
        }
        let _ = decode(&out);
    }
}

#[test]
fn failover_bodies_refuse_bad_lengths_and_flags() {
    // Install without entries, or with a ragged run of them.
    assert!(decode(&raw_frame(11, &[1, 0])).is_err(), "empty install");
    let mut ragged = vec![1, 0];
    ragged.extend_from_slice(&[0u8; 65]);
    assert!(decode(&raw_frame(11, &ragged)).is_err(), "ragged install");
    // Prepare with a short term; Gather and Ready with trailing bytes.
    assert!(decode(&raw_frame(8, &[0; 7])).is_err(), "short prepare");
    assert!(decode(&raw_frame(10, &[0; 7])).is_err(), "long gather");
    assert!(decode(&raw_frame(12, &[0; 5])).is_err(), "short ready");
    // Entries whose `more` flag is neither 0 nor 1.
    let mut body = vec![5u8];
    body.extend_from_slice(&3u32.to_le_bytes());
    body.push(2);
    assert!(decode(&raw_frame(0x80, &body)).is_err(), "more = 2");
    // NotMember is a known error code.
    assert_eq!(ErrorCode::from_u8(11), Some(ErrorCode::NotMember));
}

/// A request record must be all zeros (none) or name a client, with a `seq` below
/// 2^40 (what a log entry holds) and `first_incomplete` at most `seq`; anything else is refused by the decoder and
/// by the encoder, with the fields it found.
#[test]
fn a_malformed_request_record_is_refused() {
    let good = Body::Put {
        expires_at_ms: None,
        key: b"k",
        value: b"v",
        request: Some(RequestRecord {
            id: RequestId { client: 9, seq: 5 },
            first_incomplete: 5,
        }),
    };
    let mut out = Vec::new();
    encode(&mut out, &env(), &good, MAX).unwrap();
    // The record sits right after the header: client, seq, first_incomplete.
    let at = rowankv_wire::frame::HEADER_BYTES;
    let limit = RequestId::SEQ_LIMIT;
    for (client, seq, first) in [
        (0u64, 5u64, 0u64),
        (0, 0, 1),
        (9, 5, 6),
        (9, 0, 1),
        (9, limit, 0),
        (9, u64::MAX, 5),
    ] {
        let mut bad = out.clone();
        bad[at..at + 8].copy_from_slice(&client.to_le_bytes());
        bad[at + 8..at + 16].copy_from_slice(&seq.to_le_bytes());
        bad[at + 16..at + 24].copy_from_slice(&first.to_le_bytes());
        assert_eq!(
            decode(&bad).map(|f| f.body),
            Err(FrameError::BadRequest {
                client,
                seq,
                first_incomplete: first
            }),
            "record ({client}, {seq}, {first})"
        );
        let body = Body::Put {
            expires_at_ms: None,
            key: b"k",
            value: b"v",
            request: Some(RequestRecord {
                id: RequestId { client, seq },
                first_incomplete: first,
            }),
        };
        assert!(matches!(
            encode(&mut out.clone(), &env(), &body, MAX),
            Err(FrameError::BadRequest { .. })
        ));
    }
}

#[test]
fn an_expiry_field_that_is_neither_none_nor_a_time_is_refused() {
    // Tag 0 with a time, and tags above 1, are not canonical: refused, with
    // the field named, never read as some expiry.
    let good = encoded(&Body::Put {
        expires_at_ms: Some(5),
        key: b"k",
        value: b"v",
        request: None,
    });
    let at = HEADER_BYTES + 24;
    assert_eq!(good[at], 1);
    for (tag, time) in [(0u8, 5u64), (2, 5), (255, 0)] {
        let mut bad = good.clone();
        bad[at] = tag;
        bad[at + 1..at + 9].copy_from_slice(&time.to_le_bytes());
        let err = decode(&bad).expect_err("a bad expiry");
        assert!(err.to_string().contains("expiry"), "{err}");
    }
    let mut none = good.clone();
    none[at] = 0;
    none[at + 1..at + 9].fill(0);
    match decode(&none).expect("no expiry").body {
        Body::Put { expires_at_ms, .. } => assert_eq!(expires_at_ms, None),
        other => panic!("{other:?}"),
    }
}

/// `Load` (a server's statistics window for the CM): round trip, the layout
/// spelled out, and every malformed body refused.
#[test]
fn load_bodies_round_trip_and_malformed_ones_are_refused() {
    let entries = encode_load_entries(&[
        (ShardId(7), 40, 3),
        (ShardId(2), 1 << 40, u64::MAX),
        (ShardId(7), 2, 1),
    ]);
    assert_eq!(entries.len(), 2 * LOAD_ENTRY_BYTES, "shard 7 merged");
    assert_eq!(
        load_entries(&entries).collect::<Vec<_>>(),
        vec![(ShardId(2), 1 << 40, u64::MAX), (ShardId(7), 42, 4)]
    );
    for e in [&entries[..], &[]] {
        let body = Body::Load {
            window_ms: 500,
            entries: e,
        };
        let bytes = encoded(&body);
        assert_eq!(decode(&bytes).unwrap().body, body);
    }
    let mut raw = 500u32.to_le_bytes().to_vec();
    raw.extend_from_slice(&3u16.to_le_bytes());
    raw.extend_from_slice(&9u64.to_le_bytes());
    raw.extend_from_slice(&1u64.to_le_bytes());
    let frame = raw_frame(18, &raw);
    let f = decode(&frame).unwrap();
    match f.body {
        Body::Load { window_ms, entries } => {
            assert_eq!(window_ms, 500);
            assert_eq!(
                load_entries(entries).collect::<Vec<_>>(),
                vec![(ShardId(3), 9, 1)]
            );
        }
        other => panic!("{other:?}"),
    }
    // A torn entry, a short window, shards out of order or twice.
    assert!(decode(&raw_frame(18, &raw[..raw.len() - 1])).is_err());
    assert!(decode(&raw_frame(18, &raw[..3])).is_err());
    let mut twice = raw.clone();
    twice.extend_from_slice(&raw[4..]);
    assert!(matches!(
        decode(&raw_frame(18, &twice)),
        Err(FrameError::FieldLength(_))
    ));
    let mut descending = 500u32.to_le_bytes().to_vec();
    descending.extend_from_slice(&entries[LOAD_ENTRY_BYTES..]);
    descending.extend_from_slice(&entries[..LOAD_ENTRY_BYTES]);
    assert!(decode(&raw_frame(18, &descending)).is_err());
}

/// `Migrate` (a migration's source hands its shard to the target, §4.6) and
/// `GetMigrating`: round trips, the layout spelled out, and malformed bodies
/// refused (a torn outcome, a `last` other than 0/1, an invalid request record).
#[test]
fn migrate_bodies_round_trip_and_malformed_ones_are_refused() {
    let record = |client, seq, first_incomplete| RequestRecord {
        id: RequestId { client, seq },
        first_incomplete,
    };
    let list = vec![(record(7, 12, 10), 99), (record(1 << 60, 5, 5), 1 << 45)];
    let outcomes = encode_outcomes(&list);
    assert_eq!(outcomes.len(), 2 * MIGRATE_OUTCOME_BYTES);
    assert_eq!(outcomes_in(&outcomes).collect::<Vec<_>>(), list);
    for (o, last) in [(&outcomes[..], true), (&[][..], false)] {
        let body = Body::Migrate {
            shard: ShardId(4),
            next_version: 1 << 41,
            last,
            outcomes: o,
        };
        let bytes = encoded(&body);
        assert_eq!(bytes.len(), HEADER_BYTES + MIGRATE_FIXED_BYTES + o.len());
        assert_eq!(decode(&bytes).unwrap().body, body);
    }
    let mut raw = 4u16.to_le_bytes().to_vec();
    raw.extend_from_slice(&77u64.to_le_bytes());
    raw.push(1);
    raw.extend_from_slice(&outcomes[..MIGRATE_OUTCOME_BYTES]);
    match decode(&raw_frame(19, &raw)).unwrap().body {
        Body::Migrate {
            shard,
            next_version,
            last,
            outcomes,
        } => {
            assert_eq!((shard, next_version, last), (ShardId(4), 77, true));
            assert_eq!(outcomes_in(outcomes).collect::<Vec<_>>(), vec![list[0]]);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        decode(&raw_frame(19, &raw[..raw.len() - 1])).is_err(),
        "torn outcome"
    );
    assert!(
        decode(&raw_frame(19, &raw[..MIGRATE_FIXED_BYTES - 1])).is_err(),
        "short"
    );
    let mut bad_last = raw.clone();
    bad_last[10] = 2;
    assert!(matches!(
        decode(&raw_frame(19, &bad_last)),
        Err(FrameError::FieldLength(_))
    ));
    // An outcome of client 0, and one whose first_incomplete passes its seq.
    for bad in [record(0, 0, 0), record(3, 4, 9)] {
        let mut b = raw[..MIGRATE_FIXED_BYTES].to_vec();
        b.extend_from_slice(&encode_outcomes(&[(bad, 1)]));
        assert!(
            matches!(
                decode(&raw_frame(19, &b)),
                Err(FrameError::BadRequest { .. })
            ),
            "{bad:?}"
        );
    }
    let get = Body::GetMigrating { key: b"user:1" };
    assert_eq!(decode(&encoded(&get)).unwrap().body, get);
    let mut too_long = Vec::new();
    let key = vec![b'k'; KEY_BYTES_MAX + 1];
    assert!(matches!(
        encode(
            &mut too_long,
            &env(),
            &Body::GetMigrating { key: &key },
            MAX
        ),
        Err(FrameError::KeyTooLarge { .. })
    ));
    assert_eq!(ErrorCode::from_u8(15), Some(ErrorCode::AskSource));
}
