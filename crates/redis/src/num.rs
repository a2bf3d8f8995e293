//! Numbers in arguments and stored values, read and written as Redis reads and
//! writes them, so that a request Redis refuses is refused here too, with the same
//! error.

/// Reads a decimal `i64` as Redis's `string2ll` does (what `getLongLongFromObject`
/// applies to arguments and stored values): the protocol library's reader.
pub(crate) fn parse_i64(text: &[u8]) -> Option<i64> {
    rowankv_resp::num::parse_i64_redis(text)
}

fn digits_u64(digits: &[u8]) -> Option<u64> {
    rowankv_resp::num::parse_u64_digits(digits)
}

/// Reads a SCAN cursor as Redis's `string2ull` does: a non-negative `string2ll`
/// number, or else what C's `strtoull` accepts whole (leading white space, an
/// optional sign — a `-` wraps, as in C — then decimal digits, no overflow).
pub(crate) fn parse_cursor(text: &[u8]) -> Option<u64> {
    if let Some(value) = parse_i64(text) {
        return u64::try_from(value).ok();
    }
    let start = text
        .iter()
        .position(|b| !is_c_space(*b))
        .unwrap_or(text.len());
    let (negative, digits) = match text[start..].split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, &text[start..]),
    };
    let value = digits_u64(digits)?;
    Some(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

/// C's `isspace` in the "C" locale.
fn is_c_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// The longest float text Redis reads (`MAX_LONG_DOUBLE_CHARS`).
const FLOAT_TEXT_BYTES_MAX: usize = 5 * 1024;

/// Reads a float as Redis's `string2ld` does, as far as an `f64` allows: the whole
/// text must be a number (`1.5`, `-3`, `1e3`, `.5`, `inf`), with no leading white
/// space; NaN, and a number too large or too small for the type (`1e999`,
/// `1e-999`), are refused. Redis reads into a C `long double`, whose range is wider:
/// numbers beyond an `f64`'s range that Redis accepts are refused here.
pub(crate) fn parse_f64(text: &[u8]) -> Option<f64> {
    if text.is_empty() || text.len() >= FLOAT_TEXT_BYTES_MAX || is_c_space(text[0]) {
        return None;
    }
    let text = std::str::from_utf8(text).ok()?;
    let value: f64 = text.parse().ok()?;
    if value.is_nan() {
        return None;
    }
    // strtold reports ERANGE for an overflow to infinity and an underflow to zero;
    // Rust's parser saturates silently, so tell the cases apart by the text.
    let unsigned = text.trim_start_matches(['+', '-']);
    let spelled_infinite =
        unsigned.eq_ignore_ascii_case("inf") || unsigned.eq_ignore_ascii_case("infinity");
    if value.is_infinite() && !spelled_infinite {
        return None;
    }
    let mantissa = unsigned.split(['e', 'E']).next().unwrap_or("");
    if value == 0.0 && mantissa.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        return None;
    }
    Some(value)
}

/// Writes a float as INCRBYFLOAT stores it (Redis's "human" form): plain decimal,
/// never an exponent, no trailing zeros, `-0` as `0`. Redis prints a `long double`
/// with 17 decimals and trims; this prints the shortest text that reads back to the
/// same `f64`, which is the same text for every value either prints exactly
/// (`10.5`, `5200`, `3.0e3` → `3000`).
pub(crate) fn format_f64_human(value: f64) -> String {
    assert!(value.is_finite(), "only finite values are stored");
    if value == 0.0 {
        return "0".to_string();
    }
    format!("{value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_as_redis() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-12"), Some(-12));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1.0",
            b"9223372036854775808",
            b"-9223372036854775809",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn cursors_as_redis() {
        assert_eq!(parse_cursor(b"0"), Some(0));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"007"), Some(7));
        assert_eq!(parse_cursor(b" +7"), Some(7));
        assert_eq!(parse_cursor(b"-0"), Some(0));
        assert_eq!(parse_cursor(b"-1"), None);
        assert_eq!(parse_cursor(b"18446744073709551616"), None);
        assert_eq!(parse_cursor(b"1x"), None);
        assert_eq!(parse_cursor(b""), None);
        assert_eq!(parse_cursor(b" "), None);
    }

    #[test]
    fn floats_as_redis() {
        assert_eq!(parse_f64(b"10.50"), Some(10.5));
        assert_eq!(parse_f64(b"5.0e3"), Some(5000.0));
        assert_eq!(parse_f64(b"-.5"), Some(-0.5));
        assert_eq!(parse_f64(b"inf"), Some(f64::INFINITY));
        assert_eq!(parse_f64(b"-Infinity"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_f64(b"0.000"), Some(0.0));
        for bad in [
            &b""[..],
            b" 1",
            b"1 ",
            b"nan",
            b"1e999",
            b"1e-999",
            b"abc",
            b"1e",
            b"\xff",
        ] {
            assert_eq!(parse_f64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn human_floats() {
        assert_eq!(format_f64_human(10.5 + 0.1), "10.6");
        assert_eq!(format_f64_human(5200.0), "5200");
        assert_eq!(format_f64_human(-0.0), "0");
        assert_eq!(format_f64_human(1e21), "1000000000000000000000");
        assert_eq!(format_f64_human(-1.25), "-1.25");
    }
}
