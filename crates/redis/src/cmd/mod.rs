//! The command handlers, by family, and the argument readers they share.

pub(crate) mod cluster;
pub(crate) mod connection;
pub(crate) mod introspect;
pub(crate) mod keys;
pub(crate) mod server;
pub(crate) mod strings;

use rowankv_resp::errors;

use crate::fail::{fail, Fail};
use crate::num::parse_i64;

/// The longest string value (Redis's `proto-max-bulk-len` default, 512 MiB): a
/// write that would make a longer one is refused with `errors::STRING_TOO_LONG`.
pub(crate) const STRING_BYTES_MAX: usize = rowankv_resp::request::BULK_BYTES_MAX_DEFAULT;

/// Whether the argument is the option `word`, ASCII case ignored.
pub(crate) fn is(arg: &[u8], word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

/// An integer argument (Redis's `getLongLongFromObjectOrReply`).
pub(crate) fn int_arg(arg: &[u8]) -> Result<i64, Fail> {
    parse_i64(arg).ok_or_else(|| fail(errors::NOT_AN_INTEGER))
}

/// Refuses a value longer than [`STRING_BYTES_MAX`] (Redis's `checkStringLength`).
pub(crate) fn check_length(total_bytes: u64) -> Result<(), Fail> {
    if total_bytes > STRING_BYTES_MAX as u64 {
        return Err(fail(errors::STRING_TOO_LONG));
    }
    Ok(())
}
