//! Decimal numbers as RESP writes them: the strict reader Redis applies to request
//! lengths, a lenient one for replies, and an allocation-free writer.

/// Reads a decimal `i64` the way Redis's `string2ll` does, so that a request Redis
/// refuses is refused here too: an optional `-`, then digits without leading zeros
/// (`0` alone is allowed, `-0` is not), no `+`, no spaces, no overflow.
pub fn parse_i64_redis(text: &[u8]) -> Option<i64> {
    if text == b"0" {
        return Some(0);
    }
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some(_) => (false, text),
        None => return None,
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let magnitude = parse_u64_digits(digits)?;
    signed(negative, magnitude)
}

/// Reads a reply's integer (`:` and the RESP3 spec's `[+|-]digits`): an optional
/// sign, then at least one digit. Leading zeros are accepted, overflow is not.
pub(crate) fn parse_i64_reply(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        Some(_) => (false, text),
        None => return None,
    };
    let magnitude = parse_u64_digits(digits)?;
    signed(negative, magnitude)
}

/// At least one ASCII digit and nothing else, without overflow.
pub fn parse_u64_digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_add(u64::from(digit - b'0'))?;
    }
    Some(value)
}

fn signed(negative: bool, magnitude: u64) -> Option<i64> {
    if negative {
        i64::try_from(-i128::from(magnitude)).ok()
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Appends the decimal form of `value` without going through `fmt` (this runs for
/// every length header and integer reply).
pub(crate) fn push_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    push_u64(out, value.unsigned_abs());
}

pub(crate) fn push_u64(out: &mut Vec<u8>, mut value: u64) {
    // u64::MAX has 20 digits.
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

pub(crate) fn push_usize(out: &mut Vec<u8>, value: usize) {
    push_u64(out, value as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_rules() {
        assert_eq!(parse_i64_redis(b"0"), Some(0));
        assert_eq!(parse_i64_redis(b"7"), Some(7));
        assert_eq!(parse_i64_redis(b"-1"), Some(-1));
        assert_eq!(parse_i64_redis(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64_redis(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"00",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1a",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999999",
        ] {
            assert_eq!(
                parse_i64_redis(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn reply_rules() {
        assert_eq!(parse_i64_reply(b"+5"), Some(5));
        assert_eq!(parse_i64_reply(b"-0"), Some(0));
        assert_eq!(parse_i64_reply(b"007"), Some(7));
        assert_eq!(parse_i64_reply(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64_reply(b"+"), None);
        assert_eq!(parse_i64_reply(b""), None);
        assert_eq!(parse_i64_reply(b"1.0"), None);
    }

    #[test]
    fn writer() {
        for value in [0, 1, -1, 10, -10, i64::MAX, i64::MIN, 1234567890] {
            let mut out = Vec::new();
            push_i64(&mut out, value);
            assert_eq!(out, value.to_string().into_bytes());
        }
    }
}
