//! Property tests of the RESP decoders and encoder (run by `cargo test`): bytes from
//! the network never panic a parser; every value survives encode-then-parse in both
//! protocols; how a stream is split into reads never changes what is parsed; hostile
//! lengths, nesting bombs and truncated frames give errors or "need more bytes".

use proptest::collection::vec;
use proptest::prelude::*;
use rowankv_resp::{
    encode, encode_request, parse_reply, parse_request, Protocol, ProtocolError, ReplyLimits,
    ReplyParseError, ReplyParser, Request, RequestLimits, RequestParser, Value,
};

/// Runs a fresh request parser over `bytes` until it stops; returns what it parsed
/// and how it stopped. Must never panic.
fn drain_requests(bytes: &[u8]) -> (Vec<Request>, Result<(), ProtocolError>) {
    let mut parser = RequestParser::default();
    let mut rest = bytes;
    let mut requests = Vec::new();
    loop {
        match parser.parse(rest) {
            Ok(Some((request, consumed))) => {
                assert!(consumed > 0 && consumed <= rest.len());
                requests.push(request);
                rest = &rest[consumed..];
            }
            Ok(None) => return (requests, Ok(())),
            Err(e) => return (requests, Err(e)),
        }
    }
}

fn drain_replies(bytes: &[u8]) -> (Vec<Value>, Result<(), ReplyParseError>) {
    let mut parser = ReplyParser::default();
    let mut rest = bytes;
    let mut values = Vec::new();
    loop {
        match parser.parse(rest) {
            Ok(Some((value, consumed))) => {
                assert!(consumed > 0 && consumed <= rest.len());
                values.push(value);
                rest = &rest[consumed..];
            }
            Ok(None) => return (values, Ok(())),
            Err(e) => return (values, Err(e)),
        }
    }
}

/// Feeds `stream` to one parser in the pieces cut at `cuts`, as reads from a socket
/// would arrive, draining each complete request from the connection's buffer.
fn feed_requests(stream: &[u8], cuts: &[usize]) -> (Vec<Request>, Result<(), ProtocolError>) {
    let mut parser = RequestParser::default();
    let mut buffer = Vec::new();
    let mut requests = Vec::new();
    let mut fed = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        buffer.extend_from_slice(&stream[fed..cut]);
        fed = cut;
        loop {
            match parser.parse(&buffer) {
                Ok(Some((request, consumed))) => {
                    requests.push(request);
                    buffer.drain(..consumed);
                }
                Ok(None) => break,
                Err(e) => return (requests, Err(e)),
            }
        }
    }
    (requests, Ok(()))
}

fn feed_replies(stream: &[u8], cuts: &[usize]) -> (Vec<Value>, Result<(), ReplyParseError>) {
    let mut parser = ReplyParser::default();
    let mut buffer = Vec::new();
    let mut values = Vec::new();
    let mut fed = 0;
    for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
        buffer.extend_from_slice(&stream[fed..cut]);
        fed = cut;
        loop {
            match parser.parse(&buffer) {
                Ok(Some((value, consumed))) => {
                    values.push(value);
                    buffer.drain(..consumed);
                }
                Ok(None) => break,
                Err(e) => return (values, Err(e)),
            }
        }
    }
    (values, Ok(()))
}

/// Sorted cut positions in `0..=len` from proptest's indexes.
fn cut_points(len: usize, indexes: &[prop::sample::Index]) -> Vec<usize> {
    let mut cuts: Vec<usize> = indexes.iter().map(|i| i.index(len + 1)).collect();
    cuts.sort_unstable();
    cuts
}

/// Bytes built from RESP's own tokens, so that random input reaches past the first
/// type check into lengths, quotes and escapes.
fn resp_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"*".to_vec()),
        Just(b"$".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"0".to_vec()),
        Just(b"3".to_vec()),
        Just(b"536870912".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"'".to_vec()),
        Just(b"\\x4".to_vec()),
        Just(b"\\".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\0".to_vec()),
        Just(b"%".to_vec()),
        Just(b"~".to_vec()),
        Just(b">".to_vec()),
        Just(b"|".to_vec()),
        Just(b"=".to_vec()),
        Just(b",".to_vec()),
        Just(b"#t".to_vec()),
        Just(b"(".to_vec()),
        Just(b"_".to_vec()),
        Just(b"+".to_vec()),
        Just(b":".to_vec()),
        Just(b"!".to_vec()),
        Just(b"?".to_vec()),
        Just(b"txt:".to_vec()),
        Just(b"inf".to_vec()),
        Just(b"1.5e3".to_vec()),
        vec(any::<u8>(), 1..4),
    ];
    vec(token, 0..48).prop_map(|tokens| tokens.concat())
}

/// Bytes without CR or LF, for the one-line types.
fn line_bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(
        any::<u8>().prop_filter("no CR or LF", |b| *b != b'\r' && *b != b'\n'),
        0..16,
    )
}

/// Any value the encoder accepts whole (one-line types without CR/LF, doubles
/// other than NaN, which is not equal to itself and is tested on its own).
fn arb_value() -> impl Strategy<Value = Value> {
    use prop::num::f64 as f;
    let leaf = prop_oneof![
        line_bytes().prop_map(Value::SimpleString),
        line_bytes().prop_map(Value::Error),
        any::<i64>().prop_map(Value::Integer),
        vec(any::<u8>(), 0..32).prop_map(Value::BulkString),
        Just(Value::Null),
        Just(Value::NullArray),
        (f::POSITIVE | f::NEGATIVE | f::NORMAL | f::SUBNORMAL | f::ZERO | f::INFINITE)
            .prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
        "-?[1-9][0-9]{0,40}|0".prop_map(Value::BigNumber),
        (any::<[u8; 3]>(), vec(any::<u8>(), 0..32))
            .prop_map(|(format, text)| Value::Verbatim { format, text }),
    ];
    leaf.prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec(inner.clone(), 0..6).prop_map(Value::Set),
            vec(inner.clone(), 0..6).prop_map(Value::Push),
            vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

fn arb_protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::Resp2), Just(Protocol::Resp3)]
}

fn arb_argv() -> impl Strategy<Value = Vec<Vec<u8>>> {
    vec(vec(any::<u8>(), 0..24), 1..6)
}

/// An inline request for `argv` that quotes every byte as `\xHH`: any argv,
/// binary included, can be typed this way.
fn encode_inline(argv: &[Vec<u8>], out: &mut Vec<u8>) {
    for (i, arg) in argv.iter().enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.push(b'"');
        for byte in arg {
            out.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
        }
        out.push(b'"');
    }
    out.extend_from_slice(b"\r\n");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn request_parser_never_panics_on_any_bytes(bytes in vec(any::<u8>(), 0..512)) {
        let _outcome = drain_requests(&bytes);
    }

    #[test]
    fn request_parser_never_panics_on_resp_like_bytes(bytes in resp_like_bytes()) {
        let (whole_requests, whole_end) = drain_requests(&bytes);
        // Whatever the bytes, splitting them does not change the outcome.
        let (split_requests, split_end) = feed_requests(&bytes, &cut_points(bytes.len(), &[]));
        prop_assert_eq!(&whole_requests, &split_requests);
        prop_assert_eq!(whole_end, split_end);
    }

    #[test]
    fn reply_parser_never_panics_on_any_bytes(bytes in vec(any::<u8>(), 0..512)) {
        let _outcome = drain_replies(&bytes);
    }

    #[test]
    fn reply_parser_never_panics_on_resp_like_bytes(bytes in resp_like_bytes()) {
        let _outcome = drain_replies(&bytes);
    }

    #[test]
    fn any_bytes_split_anywhere_parse_the_same(
        bytes in resp_like_bytes(),
        indexes in vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let cuts = cut_points(bytes.len(), &indexes);
        let (whole, whole_end) = drain_requests(&bytes);
        let (split, split_end) = feed_requests(&bytes, &cuts);
        prop_assert_eq!(whole, split);
        prop_assert_eq!(whole_end, split_end);
        let (whole, whole_end) = drain_replies(&bytes);
        let (split, split_end) = feed_replies(&bytes, &cuts);
        prop_assert_eq!(format!("{whole:?}"), format!("{split:?}"));
        prop_assert_eq!(whole_end, split_end);
    }

    #[test]
    fn encode_then_parse_round_trips(value in arb_value(), protocol in arb_protocol()) {
        let mut wire = Vec::new();
        encode(&value, protocol, &mut wire);
        let parsed = parse_reply(&wire, ReplyLimits::default());
        prop_assert_eq!(parsed, Ok(Some((value.downgraded(protocol), wire.len()))));
        // Every strict prefix is incomplete, never an error.
        for cut in 0..wire.len() {
            prop_assert_eq!(parse_reply(&wire[..cut], ReplyLimits::default()), Ok(None));
        }
    }

    #[test]
    fn pipelined_replies_split_anywhere(
        values in vec(arb_value(), 1..8),
        protocol in arb_protocol(),
        indexes in vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut stream = Vec::new();
        for value in &values {
            encode(value, protocol, &mut stream);
        }
        let expected: Vec<Value> = values.iter().map(|v| v.downgraded(protocol)).collect();
        let (whole, end) = drain_replies(&stream);
        prop_assert_eq!(&whole, &expected);
        prop_assert_eq!(end, Ok(()));
        let (split, end) = feed_replies(&stream, &cut_points(stream.len(), &indexes));
        prop_assert_eq!(&split, &expected);
        prop_assert_eq!(end, Ok(()));
    }

    #[test]
    fn pipelined_requests_split_anywhere(
        requests in vec((arb_argv(), any::<bool>()), 1..10),
        indexes in vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let mut stream = Vec::new();
        for (argv, inline) in &requests {
            if *inline {
                encode_inline(argv, &mut stream);
            } else {
                encode_request(argv, &mut stream);
            }
        }
        let expected: Vec<Request> = requests.iter().map(|(argv, _)| Request::new(argv.clone())).collect();
        let (whole, end) = drain_requests(&stream);
        prop_assert_eq!(&whole, &expected);
        prop_assert_eq!(end, Ok(()));
        let (split, end) = feed_requests(&stream, &cut_points(stream.len(), &indexes));
        prop_assert_eq!(&split, &expected);
        prop_assert_eq!(end, Ok(()));
    }

    #[test]
    fn truncated_requests_need_more_bytes(argv in arb_argv(), inline in any::<bool>()) {
        let mut wire = Vec::new();
        if inline {
            encode_inline(&argv, &mut wire);
        } else {
            encode_request(&argv, &mut wire);
        }
        // An inline request is complete once its `\n` is there; the `\r` before it
        // is the last byte that may be missing.
        for cut in 0..wire.len() {
            prop_assert_eq!(parse_request(&wire[..cut], RequestLimits::default()), Ok(None));
        }
        let parsed = parse_request(&wire, RequestLimits::default());
        prop_assert_eq!(parsed, Ok(Some((Request::new(argv), wire.len()))));
    }

    #[test]
    fn hostile_request_lengths_never_panic(
        count in any::<i64>(),
        len in any::<i64>(),
        tail in vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = format!("*{count}\r\n${len}\r\n").into_bytes();
        bytes.extend_from_slice(&tail);
        let outcome = parse_request(&bytes, RequestLimits::default());
        if count > RequestLimits::default().multibulk_len_max as i64 {
            prop_assert_eq!(outcome, Err(ProtocolError::InvalidMultibulkLength));
        } else if count > 0 && (len < 0 || len > RequestLimits::default().bulk_bytes_max as i64) {
            prop_assert_eq!(outcome, Err(ProtocolError::InvalidBulkLength));
        }
    }

    #[test]
    fn hostile_reply_lengths_never_panic(
        kind in prop::sample::select(&b"$*%~>|!="[..]),
        len in any::<i64>(),
        tail in vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(format!("{len}\r\n").as_bytes());
        bytes.extend_from_slice(&tail);
        let outcome = parse_reply(&bytes, ReplyLimits::default());
        if len < -1 {
            prop_assert_eq!(outcome, Err(ReplyParseError::InvalidLength));
        }
    }
}

#[test]
fn nan_round_trips() {
    for protocol in [Protocol::Resp2, Protocol::Resp3] {
        let mut wire = Vec::new();
        encode(&Value::Double(f64::NAN), protocol, &mut wire);
        let (value, _) = parse_reply(&wire, ReplyLimits::default())
            .expect("valid")
            .expect("complete");
        match (protocol, value) {
            (Protocol::Resp3, Value::Double(d)) => assert!(d.is_nan()),
            (Protocol::Resp2, Value::BulkString(text)) => assert_eq!(text, b"nan"),
            (_, other) => panic!("{other:?}"),
        }
    }
}

#[test]
fn request_nesting_bomb_is_refused_at_once() {
    let bomb = b"*1\r\n".repeat(100_000);
    assert_eq!(
        parse_request(&bomb, RequestLimits::default()),
        Err(ProtocolError::ExpectedDollar(b'*'))
    );
}

#[test]
fn reply_nesting_bomb_is_refused_without_recursion() {
    let bomb = b"*1\r\n".repeat(100_000);
    assert_eq!(
        parse_reply(&bomb, ReplyLimits::default()),
        Err(ReplyParseError::TooDeep)
    );
    // Fed a few bytes at a time, the same.
    let (values, end) = feed_replies(&bomb, &(0..bomb.len()).step_by(7).collect::<Vec<_>>());
    assert!(values.is_empty());
    assert_eq!(end, Err(ReplyParseError::TooDeep));
    // A map and attribute bomb likewise.
    let bomb = b"%1\r\n|1\r\n".repeat(50_000);
    assert_eq!(
        parse_reply(&bomb, ReplyLimits::default()),
        Err(ReplyParseError::TooDeep)
    );
}

#[test]
fn huge_announced_lengths_wait_for_their_bytes() {
    let limits = RequestLimits::default();
    assert_eq!(parse_request(b"*1048576\r\n", limits), Ok(None));
    assert_eq!(parse_request(b"*1\r\n$536870912\r\nabc", limits), Ok(None));
    assert_eq!(
        parse_request(b"*1\r\n$536870913\r\n", limits),
        Err(ProtocolError::InvalidBulkLength)
    );
    assert_eq!(
        parse_request(b"*1048577\r\n", limits),
        Err(ProtocolError::InvalidMultibulkLength)
    );
    let limits = ReplyLimits::default();
    assert_eq!(parse_reply(b"$536870912\r\nabc", limits), Ok(None));
    assert_eq!(parse_reply(b"*4294967295\r\n:1\r\n", limits), Ok(None));
    assert_eq!(
        parse_reply(b"*4294967296\r\n", limits),
        Err(ReplyParseError::AggregateTooLong)
    );
    assert_eq!(
        parse_reply(b"%9223372036854775807\r\n", limits),
        Err(ReplyParseError::AggregateTooLong)
    );
    assert_eq!(
        parse_reply(b"$9223372036854775807\r\n", limits),
        Err(ReplyParseError::BulkTooLong)
    );
}
