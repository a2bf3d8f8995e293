//! Hostile lengths never become allocations: this test binary counts every byte it
//! allocates (through `cap`'s counting allocator) and feeds both parsers headers
//! that announce 512 MiB strings, a million arguments, four billion elements and a
//! hundred thousand nesting levels. The high-water mark of the whole binary must
//! stay far below what any of those would cost if believed.
//!
//! One test in its own binary, so nothing else allocates while it measures.

use std::alloc::System;

use cap::Cap;
use rowankv_resp::{
    ProtocolError, ReplyLimits, ReplyParseError, ReplyParser, RequestLimits, RequestParser,
};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// Far below 512 MiB (a believed bulk length), 24 MiB (a believed argument count)
/// or 100 GiB (a believed element count), and far above the inputs themselves.
const HIGH_WATER_BYTES_MAX: usize = 16 * 1024 * 1024;

#[test]
fn hostile_lengths_allocate_nothing_large() {
    // Keep every parser alive until the end, holding whatever it reserved.
    let mut requests = Vec::new();
    let request_inputs: Vec<Vec<u8>> = vec![
        b"*1048576\r\n".to_vec(),
        b"*1048576\r\n$0\r\n\r\n".to_vec(),
        b"*1\r\n$536870912\r\n".to_vec(),
        b"*1\r\n$536870912\r\nsome bytes of it".to_vec(),
        [&b"*1048576\r\n"[..], &b"$0\r\n\r\n".repeat(1000)].concat(),
    ];
    for input in &request_inputs {
        let mut parser = RequestParser::new(RequestLimits::default());
        assert_eq!(parser.parse(input), Ok(None));
        requests.push(parser);
    }
    let bomb = b"*1\r\n".repeat(100_000);
    assert_eq!(
        RequestParser::default().parse(&bomb),
        Err(ProtocolError::ExpectedDollar(b'*'))
    );

    let mut replies = Vec::new();
    let reply_inputs: Vec<Vec<u8>> = vec![
        b"$536870912\r\n".to_vec(),
        b"=536870912\r\ntxt:".to_vec(),
        b"!536870912\r\nERR".to_vec(),
        b"*4294967295\r\n".to_vec(),
        b"%4294967295\r\n".to_vec(),
        b"~4294967295\r\n:1\r\n".to_vec(),
        b">4294967295\r\n".to_vec(),
        b"|4294967295\r\n".to_vec(),
        [&b"*4294967295\r\n"[..], &b"*4294967295\r\n".repeat(100)].concat(),
    ];
    for input in &reply_inputs {
        let mut parser = ReplyParser::new(ReplyLimits::default());
        assert_eq!(
            parser.parse(input),
            Ok(None),
            "{:?}",
            String::from_utf8_lossy(input)
        );
        replies.push(parser);
    }
    assert_eq!(
        ReplyParser::default().parse(&bomb),
        Err(ReplyParseError::TooDeep)
    );

    let high_water = ALLOCATOR.max_allocated();
    assert!(
        high_water < HIGH_WATER_BYTES_MAX,
        "the parsers allocated up to {high_water} bytes for inputs of a few hundred KiB"
    );
    drop(requests);
    drop(replies);
}
