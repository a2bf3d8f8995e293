//! The client-visible history of a simulated RowanKV run.
//!
//! Every operation a simulated client issues is recorded as an [`Operation`]:
//! what it asked for, what it got back, when it was issued and when the
//! answer arrived (in simulated nanoseconds), and whether it is known to have
//! taken effect. A [`History`] is the list of those operations in the order
//! they were recorded.
//!
//! Histories are stored as JSON Lines: one JSON object per operation, for
//! example
//!
//! ```text
//! {"client":3,"op":"put","key":"k7","value":"v-3-12","call":1200,"return":5400,"status":"ok","term":4}
//! {"client":1,"op":"get","key":"k7","output":null,"call":1300,"return":2000,"status":"ok","term":4}
//! {"client":1,"op":"del","key":"k7","call":6000,"return":7100,"status":"unknown","term":0}
//! ```
//!
//! The file can be written with [`History::write_jsonl`], read back with
//! [`History::read_jsonl`], and summarized by [`History::fingerprint`], which
//! makes it easy to confirm that two runs of the same seed produced the same
//! history. The checks a history must pass live in [`crate::check`].

use std::fmt;
use std::io::{self, BufRead, Write};

use serde::de::{self, Deserializer};
use serde::ser::{self, SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The kind of a client operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Set the key to a value.
    Put,
    /// Read the key's value (or learn that it is absent).
    Get,
    /// Remove the key.
    Del,
}

impl OpKind {
    /// The name used in history files: `put`, `get` or `del`.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Put => "put",
            OpKind::Get => "get",
            OpKind::Del => "del",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an operation ended, as far as the client knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The operation completed and its answer was received.
    Ok,
    /// The operation certainly did not take effect.
    Fail,
    /// The client gave up (e.g. timed out); the operation may or may not
    /// have taken effect, at any time after it was issued.
    Unknown,
}

impl Status {
    /// The name used in history files: `ok`, `fail` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Fail => "fail",
            Status::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One client operation as the client saw it.
///
/// Serialized as one JSON object with exactly these fields, in this order:
/// `client`, `op`, `key`, `value` (put only), `output` (get only; `null`
/// when the key was absent or the get did not complete), `call`, `return`,
/// `status`, `term`. For example:
///
/// ```text
/// {"client":3,"op":"put","key":"k7","value":"v-3-12","call":1200,"return":5400,"status":"ok","term":4}
/// {"client":1,"op":"get","key":"k7","output":"v-3-12","call":5500,"return":6000,"status":"ok","term":4}
/// {"client":1,"op":"del","key":"k7","call":6100,"return":7000,"status":"ok","term":4}
/// ```
///
/// [`final_read`](Operation::final_read) is not part of the JSON form; it
/// reads back as `false`. Serializing a put without a value is an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The client that issued the operation.
    pub client: u32,
    /// What the operation does.
    pub op: OpKind,
    /// The key it addresses.
    pub key: String,
    /// The value written (put only; `None` for get and del).
    pub value: Option<String>,
    /// The value observed (get only; `None` means the key was absent, and
    /// is always the case for a get whose status is not `ok`).
    pub output: Option<String>,
    /// When the client issued the operation (simulated ns).
    pub call: u64,
    /// When the answer arrived, or, for status `unknown`, when the client
    /// gave up (simulated ns). Serialized as `return`.
    pub ret: u64,
    /// How the operation ended.
    pub status: Status,
    /// The configuration term carried by the server's answer (0 if none).
    pub term: u64,
    /// The operation belongs to the final read-back phase of a run.
    /// Not serialized.
    pub final_read: bool,
}

impl fmt::Display for Operation {
    /// A compact one-line rendering for humans, e.g.
    /// `c3 put k7 "v-3-12" [1200, 5400] ok term=4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{} {} {}", self.client, self.op, self.key)?;
        match self.op {
            OpKind::Put => match &self.value {
                Some(v) => write!(f, " {v:?}")?,
                None => f.write_str(" <no value>")?,
            },
            OpKind::Get => match &self.output {
                Some(v) => write!(f, " -> {v:?}")?,
                None => f.write_str(" -> absent")?,
            },
            OpKind::Del => {}
        }
        write!(
            f,
            " [{}, {}] {} term={}",
            self.call, self.ret, self.status, self.term
        )?;
        if self.final_read {
            f.write_str(" (final read)")?;
        }
        Ok(())
    }
}

impl Serialize for Operation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = match self.op {
            OpKind::Put | OpKind::Get => 8,
            OpKind::Del => 7,
        };
        let mut st = serializer.serialize_struct("Operation", fields)?;
        st.serialize_field("client", &self.client)?;
        st.serialize_field("op", &self.op)?;
        st.serialize_field("key", &self.key)?;
        match self.op {
            OpKind::Put => {
                let value = self.value.as_deref().ok_or_else(|| {
                    <S::Error as ser::Error>::custom(format!(
                        "put by client {} on key {:?} has no value",
                        self.client, self.key
                    ))
                })?;
                st.serialize_field("value", value)?;
            }
            OpKind::Get => {
                let output = match self.status {
                    Status::Ok => self.output.as_deref(),
                    Status::Fail | Status::Unknown => None,
                };
                st.serialize_field("output", &output)?;
            }
            OpKind::Del => {}
        }
        st.serialize_field("call", &self.call)?;
        st.serialize_field("return", &self.ret)?;
        st.serialize_field("status", &self.status)?;
        st.serialize_field("term", &self.term)?;
        st.end()
    }
}

/// Deserializes a field that is present (even if `null`) as `Some(..)`, so
/// that a missing field (`None`) can be told apart from a `null` one.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// The JSON form of an [`Operation`], before consistency checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationRepr {
    client: u32,
    op: OpKind,
    key: String,
    #[serde(default, deserialize_with = "present")]
    value: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    output: Option<Option<String>>,
    call: u64,
    #[serde(rename = "return")]
    ret: u64,
    status: Status,
    term: u64,
}

impl OperationRepr {
    fn into_operation(self) -> Result<Operation, String> {
        let (value, output) = match self.op {
            OpKind::Put => {
                if self.output.is_some() {
                    return Err("a put must not have an `output` field".into());
                }
                match self.value {
                    Some(Some(v)) => (Some(v), None),
                    Some(None) => return Err("a put's `value` must be a string, not null".into()),
                    None => return Err("a put needs a `value` field".into()),
                }
            }
            OpKind::Get => {
                if self.value.is_some() {
                    return Err("a get must not have a `value` field".into());
                }
                match self.output {
                    Some(Some(v)) if self.status != Status::Ok => {
                        return Err(format!(
                            "a get with status {} must have output null, found {v:?}",
                            self.status
                        ));
                    }
                    Some(out) => (None, out),
                    None => {
                        return Err(
                            "a get needs an `output` field (null when the key is absent)".into(),
                        )
                    }
                }
            }
            OpKind::Del => {
                if self.value.is_some() {
                    return Err("a del must not have a `value` field".into());
                }
                if self.output.is_some() {
                    return Err("a del must not have an `output` field".into());
                }
                (None, None)
            }
        };
        Ok(Operation {
            client: self.client,
            op: self.op,
            key: self.key,
            value,
            output,
            call: self.call,
            ret: self.ret,
            status: self.status,
            term: self.term,
            final_read: false,
        })
    }
}

impl<'de> Deserialize<'de> for Operation {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        OperationRepr::deserialize(deserializer)?
            .into_operation()
            .map_err(<D::Error as de::Error>::custom)
    }
}

/// Why a history could not be read.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// The underlying reader failed (or the line was not valid UTF-8).
    #[error("cannot read history line {line}: {source}")]
    Io {
        /// 1-based line number.
        line: usize,
        /// The reader's error.
        #[source]
        source: io::Error,
    },
    /// A line is not a valid operation record.
    #[error("malformed history line {line}: {source}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        #[source]
        source: serde_json::Error,
    },
}

impl HistoryError {
    /// The 1-based line number the error refers to.
    pub fn line(&self) -> usize {
        match self {
            HistoryError::Io { line, .. } | HistoryError::Malformed { line, .. } => *line,
        }
    }
}

/// The operations of one simulated run, in the order they were recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The recorded operations.
    pub ops: Vec<Operation>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an operation.
    pub fn push(&mut self, op: Operation) {
        self.ops.push(op);
    }

    /// The number of recorded operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no operation has been recorded.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Iterates over the operations in recorded order.
    pub fn iter(&self) -> std::slice::Iter<'_, Operation> {
        self.ops.iter()
    }

    /// Writes the history as JSON Lines: one JSON object per operation,
    /// each followed by `\n`.
    ///
    /// Fails if the writer fails or an operation cannot be serialized (a
    /// put without a value).
    pub fn write_jsonl(&self, w: &mut impl Write) -> io::Result<()> {
        for op in &self.ops {
            serde_json::to_writer(&mut *w, op)?;
            w.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Reads a history written by [`write_jsonl`](History::write_jsonl).
    ///
    /// Blank lines are ignored. Every other line must be one operation
    /// record; the first one that is not yields an error naming its line
    /// number. Operations read back have `final_read == false`.
    pub fn read_jsonl(r: impl BufRead) -> Result<History, HistoryError> {
        let mut history = History::new();
        for (i, line) in r.lines().enumerate() {
            let line_no = i + 1;
            let line = line.map_err(|source| HistoryError::Io {
                line: line_no,
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let op = serde_json::from_str(&line).map_err(|source| HistoryError::Malformed {
                line: line_no,
                source,
            })?;
            history.push(op);
        }
        Ok(history)
    }

    /// A stable 64-bit hash of the whole history: FNV-1a over its JSON
    /// Lines form (as produced by [`write_jsonl`](History::write_jsonl)).
    ///
    /// Two runs that recorded identical histories have equal fingerprints,
    /// and a history read back from its file has the same fingerprint as
    /// the one that was written. `final_read` is not part of the hash,
    /// because it is not part of the file.
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = Fnv1a::new();
        for op in &self.ops {
            if serde_json::to_writer(&mut hasher, op).is_err() {
                // Only a put without a value cannot be serialized; hash its
                // debug form instead so the fingerprint stays total.
                hasher.update(format!("{op:?}").as_bytes());
            }
            hasher.update(b"\n");
        }
        hasher.finish()
    }
}

impl From<Vec<Operation>> for History {
    fn from(ops: Vec<Operation>) -> Self {
        History { ops }
    }
}

impl FromIterator<Operation> for History {
    fn from_iter<I: IntoIterator<Item = Operation>>(iter: I) -> Self {
        History {
            ops: iter.into_iter().collect(),
        }
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a Operation;
    type IntoIter = std::slice::Iter<'a, Operation>;

    fn into_iter(self) -> Self::IntoIter {
        self.ops.iter()
    }
}

/// 64-bit FNV-1a, usable as an `io::Write` sink.
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv1a(Self::OFFSET)
    }

    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Write for Fnv1a {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn put(client: u32, key: &str, value: &str, call: u64, ret: u64) -> Operation {
        Operation {
            client,
            op: OpKind::Put,
            key: key.into(),
            value: Some(value.into()),
            output: None,
            call,
            ret,
            status: Status::Ok,
            term: 4,
            final_read: false,
        }
    }

    fn get(client: u32, key: &str, output: Option<&str>, call: u64, ret: u64) -> Operation {
        Operation {
            client,
            op: OpKind::Get,
            key: key.into(),
            value: None,
            output: output.map(Into::into),
            call,
            ret,
            status: Status::Ok,
            term: 4,
            final_read: false,
        }
    }

    fn del(client: u32, key: &str, call: u64, ret: u64) -> Operation {
        Operation {
            client,
            op: OpKind::Del,
            key: key.into(),
            value: None,
            output: None,
            call,
            ret,
            status: Status::Ok,
            term: 4,
            final_read: false,
        }
    }

    fn line(op: &Operation) -> String {
        serde_json::to_string(op).unwrap()
    }

    #[test]
    fn put_json_shape() {
        assert_eq!(
            line(&put(3, "k7", "v-3-12", 1200, 5400)),
            r#"{"client":3,"op":"put","key":"k7","value":"v-3-12","call":1200,"return":5400,"status":"ok","term":4}"#
        );
    }

    #[test]
    fn get_json_shape() {
        assert_eq!(
            line(&get(1, "k7", Some("v-3-12"), 10, 20)),
            r#"{"client":1,"op":"get","key":"k7","output":"v-3-12","call":10,"return":20,"status":"ok","term":4}"#
        );
        assert_eq!(
            line(&get(1, "k7", None, 10, 20)),
            r#"{"client":1,"op":"get","key":"k7","output":null,"call":10,"return":20,"status":"ok","term":4}"#
        );
    }

    #[test]
    fn get_not_ok_writes_null_output() {
        let mut op = get(1, "k7", Some("stale"), 10, 20);
        op.status = Status::Unknown;
        op.term = 0;
        assert_eq!(
            line(&op),
            r#"{"client":1,"op":"get","key":"k7","output":null,"call":10,"return":20,"status":"unknown","term":0}"#
        );
    }

    #[test]
    fn del_json_shape() {
        let mut op = del(1, "k7", 30, 40);
        op.status = Status::Fail;
        assert_eq!(
            line(&op),
            r#"{"client":1,"op":"del","key":"k7","call":30,"return":40,"status":"fail","term":4}"#
        );
    }

    #[test]
    fn put_without_value_cannot_be_written() {
        let mut op = put(1, "k", "v", 0, 1);
        op.value = None;
        let h = History::from(vec![op]);
        let mut buf = Vec::new();
        assert!(h.write_jsonl(&mut buf).is_err());
        // The fingerprint is still defined.
        assert_eq!(h.fingerprint(), h.fingerprint());
    }

    #[test]
    fn round_trip_and_fingerprint() {
        let mut h = History::new();
        h.push(put(3, "k7", "v-3-12", 1200, 5400));
        h.push(get(1, "k7", Some("v-3-12"), 5500, 6000));
        h.push(get(2, "k8", None, 5500, 6000));
        h.push(del(1, "k7", 6100, 7000));
        let mut unknown = put(0, "k\"quoted\"\n", "ünïcode", 7000, 9000);
        unknown.status = Status::Unknown;
        unknown.term = 0;
        h.push(unknown);
        assert_eq!(h.len(), 5);

        let mut buf = Vec::new();
        h.write_jsonl(&mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert_eq!(text.lines().count(), 5);
        assert!(text.ends_with('\n'));

        let back = History::read_jsonl(&buf[..]).unwrap();
        assert_eq!(back, h);
        assert_eq!(back.fingerprint(), h.fingerprint());

        let mut other = h.clone();
        other.ops[1].output = Some("v-3-13".into());
        assert_ne!(other.fingerprint(), h.fingerprint());
    }

    #[test]
    fn fingerprint_is_fixed() {
        // FNV-1a of the empty input is the offset basis.
        assert_eq!(History::new().fingerprint(), 0xcbf2_9ce4_8422_2325);
        let h = History::from(vec![put(3, "k7", "v-3-12", 1200, 5400)]);
        let mut direct = Fnv1a::new();
        direct.update(line(&h.ops[0]).as_bytes());
        direct.update(b"\n");
        assert_eq!(h.fingerprint(), direct.finish());
    }

    #[test]
    fn final_read_is_not_serialized() {
        let mut op = get(1, "k", Some("v"), 1, 2);
        op.final_read = true;
        assert!(!line(&op).contains("final"));
        let back: Operation = serde_json::from_str(&line(&op)).unwrap();
        assert!(!back.final_read);
    }

    #[test]
    fn blank_lines_are_skipped() {
        let text = "\n{\"client\":1,\"op\":\"del\",\"key\":\"k\",\"call\":1,\"return\":2,\"status\":\"ok\",\"term\":0}\n  \n";
        let h = History::read_jsonl(text.as_bytes()).unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h.ops[0].op, OpKind::Del);
    }

    fn read_err(text: &str) -> HistoryError {
        History::read_jsonl(text.as_bytes()).unwrap_err()
    }

    #[test]
    fn malformed_lines_are_reported_with_line_numbers() {
        let good =
            r#"{"client":1,"op":"del","key":"k","call":1,"return":2,"status":"ok","term":0}"#;
        let cases: &[(&str, &str)] = &[
            ("not json", "expected"),
            (
                r#"{"client":1,"op":"inc","key":"k","call":1,"return":2,"status":"ok","term":0}"#,
                "unknown variant",
            ),
            (
                r#"{"client":1,"op":"put","key":"k","call":1,"return":2,"status":"ok","term":0}"#,
                "needs a `value`",
            ),
            (
                r#"{"client":1,"op":"put","key":"k","value":null,"call":1,"return":2,"status":"ok","term":0}"#,
                "not null",
            ),
            (
                r#"{"client":1,"op":"put","key":"k","value":"v","output":null,"call":1,"return":2,"status":"ok","term":0}"#,
                "must not have an `output`",
            ),
            (
                r#"{"client":1,"op":"get","key":"k","call":1,"return":2,"status":"ok","term":0}"#,
                "needs an `output`",
            ),
            (
                r#"{"client":1,"op":"get","key":"k","value":"v","output":null,"call":1,"return":2,"status":"ok","term":0}"#,
                "must not have a `value`",
            ),
            (
                r#"{"client":1,"op":"get","key":"k","output":"v","call":1,"return":2,"status":"fail","term":0}"#,
                "must have output null",
            ),
            (
                r#"{"client":1,"op":"del","key":"k","output":null,"call":1,"return":2,"status":"ok","term":0}"#,
                "must not have an `output`",
            ),
            (
                r#"{"client":1,"op":"del","key":"k","call":1,"return":2,"status":"ok"}"#,
                "missing field `term`",
            ),
            (
                r#"{"client":1,"op":"del","key":"k","call":1,"return":2,"status":"done","term":0}"#,
                "unknown variant",
            ),
            (
                r#"{"client":1,"op":"del","key":"k","call":1,"return":2,"status":"ok","term":0,"extra":1}"#,
                "unknown field",
            ),
            (
                r#"{"client":-1,"op":"del","key":"k","call":1,"return":2,"status":"ok","term":0}"#,
                "invalid value",
            ),
        ];
        for (bad, needle) in cases {
            let text = format!("{good}\n\n{bad}\n{good}\n");
            let err = read_err(&text);
            assert_eq!(err.line(), 3, "{bad}");
            assert!(matches!(err, HistoryError::Malformed { .. }), "{bad}");
            let msg = err.to_string();
            assert!(msg.starts_with("malformed history line 3: "), "{msg}");
            assert!(msg.contains(needle), "{bad}: {msg}");
        }
    }

    #[test]
    fn invalid_utf8_is_an_io_error() {
        let mut bytes =
            br#"{"client":1,"op":"del","key":"k","call":1,"return":2,"status":"ok","term":0}"#
                .to_vec();
        bytes.extend_from_slice(b"\n\xff\xfe\n");
        let err = History::read_jsonl(&bytes[..]).unwrap_err();
        assert!(matches!(err, HistoryError::Io { line: 2, .. }), "{err}");
    }

    #[test]
    fn display_is_compact() {
        assert_eq!(
            put(3, "k7", "v-3-12", 1200, 5400).to_string(),
            r#"c3 put k7 "v-3-12" [1200, 5400] ok term=4"#
        );
        let mut g = get(1, "k7", None, 1, 2);
        g.final_read = true;
        assert_eq!(
            g.to_string(),
            "c1 get k7 -> absent [1, 2] ok term=4 (final read)"
        );
    }

    fn arb_op() -> impl Strategy<Value = Operation> {
        (
            any::<u32>(),
            0u8..3,
            "[a-z0-9\"\\\\ é]{0,6}",
            proptest::option::of("[a-zA-Z0-9\\- \"]{0,8}"),
            any::<u64>(),
            any::<u64>(),
            0u8..3,
            any::<u64>(),
        )
            .prop_map(|(client, kind, key, val, call, ret, status, term)| {
                let status = match status {
                    0 => Status::Ok,
                    1 => Status::Fail,
                    _ => Status::Unknown,
                };
                let (op, value, output) = match kind {
                    0 => (OpKind::Put, Some(val.unwrap_or_default()), None),
                    1 => (
                        OpKind::Get,
                        None,
                        if status == Status::Ok { val } else { None },
                    ),
                    _ => (OpKind::Del, None, None),
                };
                Operation {
                    client,
                    op,
                    key,
                    value,
                    output,
                    call,
                    ret,
                    status,
                    term,
                    final_read: false,
                }
            })
    }

    proptest! {
        #[test]
        fn prop_round_trip(ops in proptest::collection::vec(arb_op(), 0..20)) {
            let h = History::from(ops);
            let mut buf = Vec::new();
            h.write_jsonl(&mut buf).unwrap();
            let back = History::read_jsonl(&buf[..]).unwrap();
            prop_assert_eq!(back.fingerprint(), h.fingerprint());
            prop_assert_eq!(back, h);
        }
    }
}
