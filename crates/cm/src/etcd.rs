//! `EtcdStore`: the `CoordStore` backed by a real etcd v3 (3.4 or later), over
//! etcd's JSON gateway (`/v3/...` on the client port, plain HTTP).
//!
//! The gateway is the gRPC API transcoded to JSON: the same requests, the same
//! semantics, int64 fields as decimal strings, keys and values in base64, fields at
//! their zero value left out. It needs only a blocking HTTP client (`ureq`), so the
//! backend builds without `protoc` and without an async runtime, which the
//! `etcd-client` crate would both need.
//!
//! # Keys
//! Every key of the trait is stored as `prefix + key` (`EtcdConfig::prefix`, for
//! instance `/rowankv/<cluster>/`), so several clusters share one etcd without
//! seeing each other's keys; `list` and `watch` strip the prefix again. The prefix
//! must end with `/`, so that no cluster's prefix is a prefix of another's.
//!
//! # Revisions
//! `Revision` is etcd's store-wide revision, and a key's revision is its
//! `mod_revision`: both stores count every mutation with one counter, and 0 means
//! "absent". Every conditional operation is one etcd transaction comparing
//! `mod_revision == expect`; on an absent key etcd compares against a zeroed entry,
//! so `expect == 0` is exactly "the key is absent" (the same as
//! `create_revision == 0`). A delete followed by a re-create gives the key a new,
//! higher `mod_revision`, so a compare on the old one fails as in the embedded
//! store. On a failed compare the transaction's failure branch reads the key (and
//! the guard key), so `Conflict { current }` comes from the same atomic step.
//! Differences from the embedded store: etcd's counter starts at 1 and also counts
//! writes under other prefixes (other clusters sharing the etcd) and the deletions
//! of expiring leases, so revisions are increasing but not dense; a revision above
//! `i64::MAX` can never match and is answered as a conflict without a write.
//!
//! # Leases
//! etcd's TTLs are whole seconds: `grant_lease(ttl_ns)` asks for
//! `ceil(ttl_ns / 1 s)` seconds (at least 1), never less than asked. etcd itself may
//! grant more: it raises every TTL to its minimum, 1.5 election timeouts rounded up
//! to a second (2 s with the default 1 s election timeout; 1 s with
//! `--election-timeout 500`). A lease that lasts longer than asked never expires a
//! live holder early; it can only delay a takeover. `lease_ttl` tells what etcd
//! granted and how much is left. Expiry is etcd's: its leader checks leases every
//! 500 ms and deletes the keys of an expired one through raft, so keys vanish up to
//! about half a second after the deadline (the embedded store is exact).
//!
//! etcd forgets a lease once it is gone, so it cannot tell "expired or revoked" from
//! "never granted". This store remembers the ids it granted (8 bytes each, for the
//! life of the value): a lease etcd does not hold is `LeaseExpired` if this instance
//! granted it and `UnknownLease` otherwise. A lease granted by another instance
//! (another CM process) that has since expired therefore reads as `UnknownLease`.
//! Lease 0 is etcd's "no lease" and is always `UnknownLease`.
//!
//! # Errors
//! An unreachable etcd, a timeout (`EtcdConfig::timeout`, per call) and a
//! malformed answer are `StoreError::Unavailable`, with a message naming the
//! endpoint and the operation, never a panic. After a timeout or a malformed answer
//! to a mutation the outcome is unknown (the trait's contract for `Unavailable`):
//! callers re-read. A connection that cannot be made at all sent nothing, so the
//! next endpoint of `EtcdConfig::endpoints` is tried; reads and keep-alives are also
//! retried once on another failure. A request larger than etcd accepts
//! (`--max-request-bytes`, 1.5 MiB by default) is `LimitExceeded`, refused before
//! sending when `EtcdConfig::max_request_bytes` says so. The trait's
//! `KEYS_MAX`/`LEASES_MAX` are not enforced here: etcd's own quota
//! (`--quota-backend-bytes`) bounds the store, and hitting it is `Unavailable`.
//!
//! # Watch
//! `watch` is not part of `CoordStore` (the embedded store has no watch): it is an
//! inherent method here, a streaming `/v3/watch` read by a thread of its own.

use std::collections::HashSet;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::store::{
    CoordStore, Guard, LeaseId, Revision, StoreError, KEY_BYTES_MAX, VALUE_BYTES_MAX,
};

/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// The longest TTL etcd grants (its `MaxLeaseTTL`), in seconds.
pub const ETCD_LEASE_TTL_S_MAX: u64 = 9_000_000_000;
/// What a request adds to its keys and value when etcd encodes it (compares,
/// operation headers, lease id): a generous bound.
const REQUEST_OVERHEAD_BYTES: usize = 512;
/// Said of a mutation whose answer did not come.
const MAYBE_APPLIED: &str = "; the write may or may not have been applied: re-read to find out";
/// The largest answer read from etcd.
const ANSWER_BYTES_MAX: u64 = 256 << 20;
/// The longest line of a watch stream (one event batch).
const WATCH_LINE_BYTES_MAX: usize = 256 << 20;

/// How to reach etcd and where in it this store lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members, `http://host:port` (or `host:port`). Calls go
    /// to the last one that answered; one that refuses the connection is skipped.
    pub endpoints: Vec<String>,
    /// Prepended to every key; must end with `/` (see the module doc).
    pub prefix: String,
    /// The longest one call may take, connection included.
    pub timeout: Duration,
    /// The etcd server's `--max-request-bytes`: larger writes are refused here with
    /// `LimitExceeded` instead of being sent.
    pub max_request_bytes: usize,
}

impl EtcdConfig {
    /// `endpoints` and `prefix` with a 5 s timeout and etcd's default request limit.
    pub fn new<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
        prefix: impl Into<String>,
    ) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: prefix.into(),
            timeout: Duration::from_secs(5),
            max_request_bytes: ETCD_DEFAULT_MAX_REQUEST_BYTES,
        }
    }

    /// The configuration of cluster `cluster`: keys under `/rowankv/<cluster>/`.
    pub fn for_cluster<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
        cluster: &str,
    ) -> EtcdConfig {
        EtcdConfig::new(endpoints, format!("/rowankv/{cluster}/"))
    }
}

/// A lease as etcd holds it (`lease_ttl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTtl {
    /// Seconds until it expires unless kept alive.
    pub remaining_s: u64,
    /// The TTL etcd granted, in seconds (at least what was asked).
    pub granted_s: u64,
}

#[derive(Clone, Debug)]
struct Endpoint {
    /// `http://host:port`
    url: String,
    /// `host:port`
    authority: String,
}

/// The `CoordStore` on a real etcd v3. Thread-safe; any number of instances (in one
/// process or many) may share an etcd and a prefix, as two CMs do.
pub struct EtcdStore {
    config: EtcdConfig,
    endpoints: Vec<Endpoint>,
    agent: ureq::Agent,
    /// The endpoint that answered last, tried first.
    current: AtomicUsize,
    /// Leases granted through this instance.
    granted: Mutex<HashSet<u64>>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.config.endpoints)
            .field("prefix", &self.config.prefix)
            .finish_non_exhaustive()
    }
}

/// Why a call failed, before it is turned into the operation's `StoreError`.
enum CallError {
    /// etcd unreachable, timed out, refused for another reason, or answered
    /// something that is not etcd's JSON: the message says which.
    Unavailable(String),
    /// etcd does not hold the lease named in the request.
    LeaseNotFound,
    /// The request was larger than etcd accepts.
    TooLarge,
}

/// A decoded answer, with what is needed to report it malformed.
struct Answer {
    op: &'static str,
    endpoint: String,
    value: Value,
}

impl Answer {
    fn malformed(&self, detail: impl fmt::Display) -> StoreError {
        StoreError::Unavailable(format!(
            "etcd at {} gave a malformed answer to {}: {detail}",
            self.endpoint, self.op
        ))
    }

    /// `header.revision` (positive).
    fn header_revision(&self) -> Result<u64, StoreError> {
        let header = self.value.get("header").unwrap_or(&Value::Null);
        match int_field(header, "revision") {
            Ok(r) if r > 0 => Ok(r),
            Ok(_) => Err(self.malformed("no header revision")),
            Err(e) => Err(self.malformed(e)),
        }
    }
}

fn unavailable_to_store(op: &'static str, e: CallError) -> StoreError {
    match e {
        CallError::Unavailable(message) => StoreError::Unavailable(message),
        CallError::LeaseNotFound => StoreError::Unavailable(format!(
            "etcd answered {op} with \"requested lease not found\" although it names no lease"
        )),
        CallError::TooLarge => StoreError::Unavailable(format!("etcd refused {op} as too large")),
    }
}

/// An int64 field of etcd's JSON: absent (proto3 zero), a decimal string, or a
/// number.
fn i64_field(object: &Value, name: &str) -> Result<i64, String> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse::<i64>()
            .map_err(|_| format!("field {name:?} is not an integer: {s:?}")),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| format!("field {name:?} is not an integer: {n}")),
        Some(other) => Err(format!("field {name:?} is not an integer: {other}")),
    }
}

/// A non-negative int64 field.
fn int_field(object: &Value, name: &str) -> Result<u64, String> {
    let v = i64_field(object, name)?;
    u64::try_from(v).map_err(|_| format!("field {name:?} is negative: {v}"))
}

/// A bytes field: absent (empty) or base64.
fn bytes_field(object: &Value, name: &str) -> Result<Vec<u8>, String> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => BASE64
            .decode(s)
            .map_err(|e| format!("field {name:?} is not base64: {e}")),
        Some(other) => Err(format!("field {name:?} is not a string: {other}")),
    }
}

fn bool_field(object: &Value, name: &str) -> Result<bool, String> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("field {name:?} is not a boolean: {other}")),
    }
}

/// An array field: absent (empty) or an array.
fn array_field<'a>(object: &'a Value, name: &str) -> Result<&'a [Value], String> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("field {name:?} is not an array: {other}")),
    }
}

/// One `mvccpb.KeyValue`: key, value, mod_revision.
fn parse_kv(kv: &Value) -> Result<(Vec<u8>, Vec<u8>, u64), String> {
    if !kv.is_object() {
        return Err(format!("a key-value is not an object: {kv}"));
    }
    let key = bytes_field(kv, "key")?;
    let value = bytes_field(kv, "value")?;
    let revision = int_field(kv, "mod_revision")?;
    if revision == 0 {
        return Err("a key-value has no mod_revision".to_owned());
    }
    Ok((key, value, revision))
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` for a
/// prefix); `[0]` (to the end of the key space) if there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn b64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

fn parse_endpoint(endpoint: &str) -> Result<Endpoint, String> {
    let rest = if let Some(rest) = endpoint.strip_prefix("http://") {
        rest
    } else if endpoint.starts_with("https://") {
        return Err(format!(
            "endpoint {endpoint:?}: TLS is not supported, use an http:// client URL"
        ));
    } else if endpoint.contains("://") {
        return Err(format!("endpoint {endpoint:?}: only http:// is supported"));
    } else {
        endpoint
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
        return Err(format!(
            "endpoint {endpoint:?} is not of the form http://host:port"
        ));
    }
    Ok(Endpoint {
        url: format!("http://{authority}"),
        authority: authority.to_owned(),
    })
}

/// True if the request certainly never reached the server.
fn not_sent(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::AddrNotAvailable
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
        ),
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Timeout(t) => matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve),
        _ => false,
    }
}

impl EtcdStore {
    /// A store on `config`. Validates the configuration; contacts no one (the first
    /// call does, and fails with `Unavailable` if etcd cannot be reached). An invalid
    /// configuration is `Unavailable` naming the problem.
    pub fn new(config: EtcdConfig) -> Result<EtcdStore, StoreError> {
        let invalid = |detail: String| {
            StoreError::Unavailable(format!("invalid etcd configuration: {detail}"))
        };
        if config.endpoints.is_empty() {
            return Err(invalid("no endpoints".to_owned()));
        }
        let endpoints = config
            .endpoints
            .iter()
            .map(|e| parse_endpoint(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        if !config.prefix.ends_with('/') {
            return Err(invalid(format!(
                "prefix {:?} must end with '/', so that no cluster's keys are a prefix of \
                 another's",
                config.prefix
            )));
        }
        if config.timeout.is_zero() {
            return Err(invalid("timeout is zero".to_owned()));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(config.timeout))
            .http_status_as_error(false)
            // etcd is reached directly, never through an HTTP proxy named in the
            // environment (the watch's own connection could not follow one).
            .proxy(None)
            .user_agent("rowankv-cm")
            .build()
            .into();
        Ok(EtcdStore {
            config,
            endpoints,
            agent,
            current: AtomicUsize::new(0),
            granted: Mutex::new(HashSet::new()),
        })
    }

    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.config.prefix.len() + key.len());
        full.extend_from_slice(self.config.prefix.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// The trait's key of an etcd key under the prefix.
    fn strip_key(&self, answer: &Answer, full: &[u8]) -> Result<String, StoreError> {
        let rest = full
            .strip_prefix(self.config.prefix.as_bytes())
            .ok_or_else(|| {
                answer.malformed(format!(
                    "key {:?} is outside the prefix {:?}",
                    String::from_utf8_lossy(full),
                    self.config.prefix
                ))
            })?;
        String::from_utf8(rest.to_vec()).map_err(|_| {
            answer.malformed(format!(
                "key {:?} is not UTF-8",
                String::from_utf8_lossy(full)
            ))
        })
    }

    /// POST `body` to `path`; the decoded JSON of a 200 answer. `retry`: the call is
    /// safe to repeat (a read or a keep-alive), so one failure after sending is
    /// retried once.
    fn call(
        &self,
        op: &'static str,
        path: &str,
        body: &Value,
        retry: bool,
    ) -> Result<Answer, CallError> {
        let body = body.to_string();
        let count = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed) % count;
        let mut refused = Vec::new();
        let mut retries_left = usize::from(retry);
        let mut i = 0;
        while i < count {
            let index = (start + i) % count;
            let endpoint = &self.endpoints[index];
            let url = format!("{}{path}", endpoint.url);
            let sent = self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.as_bytes());
            match sent {
                Ok(response) => {
                    self.current.store(index, Ordering::Relaxed);
                    return self.answer(op, endpoint, response);
                }
                Err(e) if not_sent(&e) => {
                    refused.push(format!("{}: {e}", endpoint.url));
                    i += 1;
                }
                Err(e) if retries_left > 0 => {
                    retries_left -= 1;
                    refused.push(format!("{}: {e} (retried)", endpoint.url));
                }
                Err(ureq::Error::Timeout(t)) => {
                    return Err(CallError::Unavailable(format!(
                        "etcd at {} did not answer {op} within {:?} ({t} timeout){}",
                        endpoint.url,
                        self.config.timeout,
                        if retry { "" } else { MAYBE_APPLIED }
                    )))
                }
                Err(e) => {
                    return Err(CallError::Unavailable(format!(
                        "etcd at {}: {op} failed: {e}{}",
                        endpoint.url,
                        if retry { "" } else { MAYBE_APPLIED }
                    )))
                }
            }
        }
        Err(CallError::Unavailable(format!(
            "etcd is unreachable: {op} could not connect to any endpoint ({})",
            refused.join("; ")
        )))
    }

    fn answer(
        &self,
        op: &'static str,
        endpoint: &Endpoint,
        mut response: ureq::http::Response<ureq::Body>,
    ) -> Result<Answer, CallError> {
        let status = response.status().as_u16();
        let text = match response
            .body_mut()
            .with_config()
            .limit(ANSWER_BYTES_MAX)
            .read_to_string()
        {
            Ok(text) => text,
            Err(ureq::Error::Timeout(t)) => {
                return Err(CallError::Unavailable(format!(
                    "etcd at {} did not finish answering {op} within {:?} ({t} timeout); a \
                     write may or may not have been applied",
                    endpoint.url, self.config.timeout
                )))
            }
            Err(e) => {
                return Err(CallError::Unavailable(format!(
                    "etcd at {}: reading the answer to {op} failed: {e}",
                    endpoint.url
                )))
            }
        };
        let malformed = |detail: String| {
            CallError::Unavailable(format!(
                "etcd at {} gave a malformed answer to {op} (HTTP {status}): {detail}",
                endpoint.url
            ))
        };
        // Streaming endpoints answer with one JSON object per line; a unary call
        // with one object.
        let first = text
            .lines()
            .find(|line| !line.trim().is_empty())
            .unwrap_or("");
        let value: Value = serde_json::from_str(first).map_err(|e| {
            let shown: String = text.chars().take(200).collect();
            malformed(format!("{e}: {shown:?}"))
        })?;
        if !value.is_object() {
            return Err(malformed(format!("not a JSON object: {value}")));
        }
        // A gRPC error: a unary call's {"error","message","code"} with an HTTP error
        // status, or a stream's {"error":{"grpc_code","http_code","message"}}.
        let error = match value.get("error") {
            Some(Value::Object(inner)) => Some((
                inner
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                inner.get("grpc_code").and_then(Value::as_i64).unwrap_or(-1),
            )),
            Some(Value::String(e)) if status != 200 => Some((
                value
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or(e)
                    .to_owned(),
                value.get("code").and_then(Value::as_i64).unwrap_or(-1),
            )),
            _ if status != 200 => Some((value.to_string(), -1)),
            _ => None,
        };
        if let Some((message, code)) = error {
            if message.contains("requested lease not found") {
                return Err(CallError::LeaseNotFound);
            }
            // gRPC ResourceExhausted: a message over the server's receive limit.
            if message.contains("request is too large") || code == 8 {
                return Err(CallError::TooLarge);
            }
            return Err(CallError::Unavailable(format!(
                "etcd at {} refused {op}: {message} (gRPC code {code}, HTTP {status})",
                endpoint.url
            )));
        }
        let value = match value.get("result") {
            Some(result) if result.is_object() => result.clone(),
            Some(other) => return Err(malformed(format!("result is not an object: {other}"))),
            None => value,
        };
        // Every etcd answer carries the store's revision: one without is not etcd's.
        let header = value.get("header").unwrap_or(&Value::Null);
        if !matches!(int_field(header, "revision"), Ok(r) if r > 0) {
            return Err(malformed(format!("no header revision in {value}")));
        }
        Ok(Answer {
            op,
            endpoint: endpoint.url.clone(),
            value,
        })
    }

    /// Refuse a write etcd would refuse: the trait's limits, then etcd's request size.
    fn check_write_size(&self, keys_bytes: usize, value: &[u8]) -> Result<(), StoreError> {
        if value.len() > VALUE_BYTES_MAX {
            return Err(StoreError::LimitExceeded {
                what: "value length",
                max: VALUE_BYTES_MAX,
            });
        }
        if keys_bytes + value.len() + REQUEST_OVERHEAD_BYTES > self.config.max_request_bytes {
            return Err(StoreError::LimitExceeded {
                what: "etcd request size (the etcd server's --max-request-bytes)",
                max: self.config.max_request_bytes,
            });
        }
        Ok(())
    }

    fn check_key(key: &str) -> Result<(), StoreError> {
        if key.len() > KEY_BYTES_MAX {
            return Err(StoreError::LimitExceeded {
                what: "key length",
                max: KEY_BYTES_MAX,
            });
        }
        Ok(())
    }

    /// The error for a lease etcd does not hold (see the module doc).
    fn lease_gone(&self, lease: LeaseId) -> StoreError {
        if self.granted.lock().contains(&lease.0) {
            StoreError::LeaseExpired(lease)
        } else {
            StoreError::UnknownLease(lease)
        }
    }

    /// etcd's id of `lease`, or `None` if no etcd lease can have it (0 is "no lease";
    /// etcd ids are positive int64).
    fn etcd_lease_id(lease: LeaseId) -> Option<i64> {
        i64::try_from(lease.0).ok().filter(|id| *id > 0)
    }

    fn map_write_error(
        &self,
        op: &'static str,
        lease: Option<LeaseId>,
        e: CallError,
    ) -> StoreError {
        match (e, lease) {
            (CallError::LeaseNotFound, Some(lease)) => self.lease_gone(lease),
            (CallError::TooLarge, _) => StoreError::LimitExceeded {
                what: "etcd request size (the etcd server's --max-request-bytes)",
                max: self.config.max_request_bytes,
            },
            (e, _) => unavailable_to_store(op, e),
        }
    }

    /// The `mod_revision` of the only key of a range answer (0: absent).
    fn range_revision(answer: &Answer, range: &Value, full: &[u8]) -> Result<u64, StoreError> {
        let kvs = array_field(range, "kvs").map_err(|e| answer.malformed(e))?;
        match kvs {
            [] => Ok(0),
            [kv] => {
                let (key, _, revision) = parse_kv(kv).map_err(|e| answer.malformed(e))?;
                if key != full {
                    return Err(answer.malformed(format!(
                        "asked for key {:?}, got {:?}",
                        String::from_utf8_lossy(full),
                        String::from_utf8_lossy(&key)
                    )));
                }
                Ok(revision)
            }
            _ => Err(answer.malformed(format!("{} keys for one key", kvs.len()))),
        }
    }

    /// Run a transaction: `compares` are `(full key, expected mod_revision)`; on
    /// success `then` (one request op); on failure each compared key is read. Ok(Ok(
    /// revision)) if it succeeded, Ok(Err(current revisions)) if a compare failed.
    fn txn(
        &self,
        op: &'static str,
        compares: &[(&[u8], u64)],
        then: Value,
        lease: Option<LeaseId>,
    ) -> Result<Result<Revision, Vec<Revision>>, StoreError> {
        let compare: Vec<Value> = compares
            .iter()
            .map(|(key, revision)| {
                json!({
                    "key": b64(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": revision.to_string(),
                })
            })
            .collect();
        let failure: Vec<Value> = compares
            .iter()
            .map(|(key, _)| json!({ "request_range": { "key": b64(key) } }))
            .collect();
        let body = json!({ "compare": compare, "success": [then], "failure": failure });
        let answer = self
            .call(op, "/v3/kv/txn", &body, false)
            .map_err(|e| self.map_write_error(op, lease, e))?;
        let revision = answer.header_revision()?;
        let succeeded = bool_field(&answer.value, "succeeded").map_err(|e| answer.malformed(e))?;
        if succeeded {
            return Ok(Ok(revision));
        }
        let responses = array_field(&answer.value, "responses").map_err(|e| answer.malformed(e))?;
        if responses.len() != compares.len() {
            return Err(answer.malformed(format!(
                "{} responses in the failure branch, expected {}",
                responses.len(),
                compares.len()
            )));
        }
        let mut current = Vec::with_capacity(compares.len());
        for ((key, _), response) in compares.iter().zip(responses) {
            let range = response
                .get("response_range")
                .ok_or_else(|| answer.malformed("a failure response is not a range"))?;
            current.push(Self::range_revision(&answer, range, key)?);
        }
        Ok(Err(current))
    }

    fn put_request(full: &[u8], value: &[u8], lease: Option<i64>) -> Value {
        let mut put = json!({ "key": b64(full), "value": b64(value) });
        if let Some(lease) = lease {
            put["lease"] = Value::String(lease.to_string());
        }
        json!({ "request_put": put })
    }

    /// The etcd id of a lease a key is to be attached to.
    fn attach_lease(lease: Option<LeaseId>) -> Result<Option<i64>, StoreError> {
        match lease {
            None => Ok(None),
            Some(lease) => Self::etcd_lease_id(lease)
                .map(Some)
                .ok_or(StoreError::UnknownLease(lease)),
        }
    }

    /// Conflict on `key` at its current revision, for a compare that cannot match.
    fn conflict_now(&self, key: &str) -> StoreError {
        match self.get(key) {
            Ok(found) => StoreError::Conflict {
                key: key.to_owned(),
                current: found.map_or(0, |(_, r)| r),
            },
            Err(e) => e,
        }
    }

    /// What etcd holds of `lease`: `None` if it does not hold it (expired, revoked or
    /// never granted).
    pub fn lease_ttl(&self, lease: LeaseId) -> Result<Option<LeaseTtl>, StoreError> {
        const OP: &str = "lease time-to-live";
        let Some(id) = Self::etcd_lease_id(lease) else {
            return Ok(None);
        };
        let answer = self
            .call(
                OP,
                "/v3/lease/timetolive",
                &json!({ "ID": id.to_string() }),
                true,
            )
            .map_err(|e| unavailable_to_store(OP, e))?;
        let remaining = i64_field(&answer.value, "TTL").map_err(|e| answer.malformed(e))?;
        if remaining < 0 {
            return Ok(None);
        }
        let granted = int_field(&answer.value, "grantedTTL").map_err(|e| answer.malformed(e))?;
        Ok(Some(LeaseTtl {
            remaining_s: remaining.unsigned_abs(),
            granted_s: granted,
        }))
    }

    /// The etcd server's version (`GET /version`), e.g. `"3.4.23"`: a health check.
    pub fn server_version(&self) -> Result<String, StoreError> {
        let mut failures = Vec::new();
        for endpoint in &self.endpoints {
            let url = format!("{}/version", endpoint.url);
            match self.agent.get(&url).call() {
                Ok(mut response) => {
                    let text = response
                        .body_mut()
                        .with_config()
                        .limit(1 << 16)
                        .read_to_string()
                        .map_err(|e| {
                            StoreError::Unavailable(format!(
                                "etcd at {}: reading /version failed: {e}",
                                endpoint.url
                            ))
                        })?;
                    let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    return value
                        .get("etcdserver")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| {
                            StoreError::Unavailable(format!(
                                "etcd at {} gave a malformed answer to /version: {text:?}",
                                endpoint.url
                            ))
                        });
                }
                Err(e) => failures.push(format!("{}: {e}", endpoint.url)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "etcd is unreachable: /version failed on every endpoint ({})",
            failures.join("; ")
        )))
    }

    /// Watch every key starting with `prefix` (under this store's prefix) for
    /// changes after revision `after` (0: from now on). With `after` = the revision
    /// a `get` or `list` returned, no change is missed between the read and the
    /// watch. Returns once etcd has created the watch; events then arrive in
    /// revision order on a thread of the watch's own, until the `Watch` is dropped.
    /// A watch whose stream ends (etcd gone, or `after` compacted away) delivers one
    /// `Err` and then nothing: make a new one from a fresh read.
    pub fn watch(&self, prefix: &str, after: Revision) -> Result<Watch, StoreError> {
        let full = self.full_key(prefix);
        let start = if after == 0 {
            0
        } else {
            i64::try_from(after.saturating_add(1)).unwrap_or(i64::MAX)
        };
        let body = json!({
            "create_request": {
                "key": b64(&full),
                "range_end": b64(&prefix_end(&full)),
                "start_revision": start.to_string(),
            }
        })
        .to_string();
        let start_at = self.current.load(Ordering::Relaxed) % self.endpoints.len();
        let mut failures = Vec::new();
        for i in 0..self.endpoints.len() {
            let endpoint = &self.endpoints[(start_at + i) % self.endpoints.len()];
            match Watch::open(endpoint, &self.config, &body) {
                Ok(watch) => return Ok(watch),
                Err(WatchOpenError::NotSent(e)) => failures.push(format!("{}: {e}", endpoint.url)),
                Err(WatchOpenError::Failed(e)) => return Err(e),
            }
        }
        Err(StoreError::Unavailable(format!(
            "etcd is unreachable: watch could not connect to any endpoint ({})",
            failures.join("; ")
        )))
    }
}

impl CoordStore for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, Revision)>, StoreError> {
        const OP: &str = "get";
        let full = self.full_key(key);
        let answer = self
            .call(OP, "/v3/kv/range", &json!({ "key": b64(&full) }), true)
            .map_err(|e| unavailable_to_store(OP, e))?;
        let kvs = array_field(&answer.value, "kvs").map_err(|e| answer.malformed(e))?;
        match kvs {
            [] => Ok(None),
            [kv] => {
                let (found, value, revision) = parse_kv(kv).map_err(|e| answer.malformed(e))?;
                if found != full {
                    return Err(answer.malformed(format!(
                        "asked for key {key:?}, got {:?}",
                        String::from_utf8_lossy(&found)
                    )));
                }
                Ok(Some((value, revision)))
            }
            _ => Err(answer.malformed(format!("{} keys for one key", kvs.len()))),
        }
    }

    fn put_if(
        &self,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        const OP: &str = "put_if";
        Self::check_key(key)?;
        let full = self.full_key(key);
        self.check_write_size(3 * full.len(), value)?;
        if i64::try_from(expect).is_err() {
            return Err(self.conflict_now(key));
        }
        let lease_id = Self::attach_lease(lease)?;
        let put = Self::put_request(&full, value, lease_id);
        match self.txn(OP, &[(&full, expect)], put, lease)? {
            Ok(revision) => Ok(revision),
            Err(current) => Err(StoreError::Conflict {
                key: key.to_owned(),
                current: current[0],
            }),
        }
    }

    fn put_if_guarded(
        &self,
        guard: &Guard,
        key: &str,
        value: &[u8],
        expect: Revision,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        const OP: &str = "put_if_guarded";
        Self::check_key(key)?;
        let full = self.full_key(key);
        let guard_full = self.full_key(&guard.key);
        self.check_write_size(3 * full.len() + 2 * guard_full.len(), value)?;
        if i64::try_from(guard.revision).is_err() {
            return Err(self.conflict_now(&guard.key));
        }
        if i64::try_from(expect).is_err() {
            return Err(self.conflict_now(key));
        }
        let lease_id = Self::attach_lease(lease)?;
        let put = Self::put_request(&full, value, lease_id);
        match self.txn(
            OP,
            &[(&guard_full, guard.revision), (&full, expect)],
            put,
            lease,
        )? {
            Ok(revision) => Ok(revision),
            // The guard is checked first, as in the embedded store.
            Err(current) if current[0] != guard.revision => Err(StoreError::Conflict {
                key: guard.key.clone(),
                current: current[0],
            }),
            Err(current) => Err(StoreError::Conflict {
                key: key.to_owned(),
                current: current[1],
            }),
        }
    }

    fn delete_if(&self, key: &str, expect: Revision) -> Result<(), StoreError> {
        const OP: &str = "delete_if";
        let full = self.full_key(key);
        if i64::try_from(expect).is_err() {
            return Err(self.conflict_now(key));
        }
        let delete = json!({ "request_delete_range": { "key": b64(&full) } });
        match self.txn(OP, &[(&full, expect)], delete, None)? {
            Ok(_) => Ok(()),
            Err(current) => Err(StoreError::Conflict {
                key: key.to_owned(),
                current: current[0],
            }),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>, Revision)>, StoreError> {
        const OP: &str = "list";
        let full = self.full_key(prefix);
        let body = json!({ "key": b64(&full), "range_end": b64(&prefix_end(&full)) });
        let answer = self
            .call(OP, "/v3/kv/range", &body, true)
            .map_err(|e| unavailable_to_store(OP, e))?;
        let kvs = array_field(&answer.value, "kvs").map_err(|e| answer.malformed(e))?;
        let mut listed = Vec::with_capacity(kvs.len());
        for kv in kvs {
            let (found, value, revision) = parse_kv(kv).map_err(|e| answer.malformed(e))?;
            if !found.starts_with(&full) {
                return Err(answer.malformed(format!(
                    "key {:?} does not start with the listed prefix",
                    String::from_utf8_lossy(&found)
                )));
            }
            listed.push((self.strip_key(&answer, &found)?, value, revision));
        }
        // etcd answers in key order; the trait promises it, so make sure.
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }

    fn grant_lease(&self, ttl_ns: u64) -> Result<LeaseId, StoreError> {
        const OP: &str = "grant_lease";
        assert!(ttl_ns > 0, "a lease needs a positive time-to-live");
        // Whole seconds, rounded up: never shorter than asked.
        let ttl_s = ttl_ns.div_ceil(1_000_000_000);
        if ttl_s > ETCD_LEASE_TTL_S_MAX {
            return Err(StoreError::LimitExceeded {
                what: "lease ttl in seconds (etcd's maximum)",
                max: ETCD_LEASE_TTL_S_MAX as usize,
            });
        }
        let answer = self
            .call(
                OP,
                "/v3/lease/grant",
                &json!({ "TTL": ttl_s.to_string() }),
                false,
            )
            .map_err(|e| unavailable_to_store(OP, e))?;
        if let Some(error) = answer.value.get("error").and_then(Value::as_str) {
            if !error.is_empty() {
                return Err(StoreError::Unavailable(format!(
                    "etcd at {} refused {OP}: {error}",
                    answer.endpoint
                )));
            }
        }
        let id = int_field(&answer.value, "ID").map_err(|e| answer.malformed(e))?;
        let granted = int_field(&answer.value, "TTL").map_err(|e| answer.malformed(e))?;
        if id == 0 {
            return Err(answer.malformed("lease id 0"));
        }
        if granted < ttl_s {
            return Err(answer.malformed(format!(
                "granted a TTL of {granted} s, shorter than the {ttl_s} s asked"
            )));
        }
        self.granted.lock().insert(id);
        Ok(LeaseId(id))
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        const OP: &str = "keep_alive";
        let Some(id) = Self::etcd_lease_id(lease) else {
            return Err(StoreError::UnknownLease(lease));
        };
        // The keep-alive endpoint is a stream; one request in the body gets one
        // answer, then the stream ends with the body.
        let answer = match self.call(
            OP,
            "/v3/lease/keepalive",
            &json!({ "ID": id.to_string() }),
            true,
        ) {
            Ok(answer) => answer,
            Err(CallError::LeaseNotFound) => return Err(self.lease_gone(lease)),
            Err(e) => return Err(unavailable_to_store(OP, e)),
        };
        let ttl = i64_field(&answer.value, "TTL").map_err(|e| answer.malformed(e))?;
        if ttl > 0 {
            Ok(())
        } else {
            // etcd answers a lease it does not hold with TTL 0.
            Err(self.lease_gone(lease))
        }
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        const OP: &str = "revoke";
        let Some(id) = Self::etcd_lease_id(lease) else {
            return Err(StoreError::UnknownLease(lease));
        };
        match self.call(
            OP,
            "/v3/lease/revoke",
            &json!({ "ID": id.to_string() }),
            false,
        ) {
            Ok(_) => Ok(()),
            Err(CallError::LeaseNotFound) => match self.lease_gone(lease) {
                // Already expired or revoked: revoking again succeeds.
                StoreError::LeaseExpired(_) => Ok(()),
                e => Err(e),
            },
            Err(e) => Err(unavailable_to_store(OP, e)),
        }
    }
}

// ---- Watch -----------------------------------------------------------------------

/// A change seen by a `Watch`. Keys are relative to the store's prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// `key` was put (created or replaced) at `revision`.
    Put {
        key: String,
        value: Vec<u8>,
        revision: Revision,
    },
    /// `key` was deleted at `revision` (by `delete_if`, or its lease ended).
    Delete { key: String, revision: Revision },
}

impl WatchEvent {
    pub fn key(&self) -> &str {
        match self {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. } => key,
        }
    }

    pub fn revision(&self) -> Revision {
        match self {
            WatchEvent::Put { revision, .. } | WatchEvent::Delete { revision, .. } => *revision,
        }
    }
}

/// A running watch (`EtcdStore::watch`). Dropping it closes the stream and joins
/// its thread.
pub struct Watch {
    events: mpsc::Receiver<Result<WatchEvent, StoreError>>,
    socket: TcpStream,
    closing: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

enum WatchOpenError {
    /// The connection could not be made: nothing was sent.
    NotSent(io::Error),
    Failed(StoreError),
}

/// The HTTP/1.1 response of a streaming call: status, then the body's lines.
struct Stream {
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes left of the current chunk (or of a Content-Length body).
    left: usize,
    done: bool,
}

impl Stream {
    fn read_line_crlf(&mut self) -> io::Result<String> {
        let mut line = Vec::new();
        let n = (&mut self.reader)
            .take(64 * 1024)
            .read_until(b'\n', &mut line)?;
        if n == 0 || !line.ends_with(b"\n") {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ended inside a line",
            ));
        }
        while matches!(line.last(), Some(b'\n' | b'\r')) {
            line.pop();
        }
        String::from_utf8(line)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a header is not UTF-8"))
    }

    /// Status code and whether the body is chunked (else its Content-Length).
    fn open(reader: BufReader<TcpStream>) -> io::Result<(u16, Stream)> {
        let mut stream = Stream {
            reader,
            chunked: false,
            left: 0,
            done: false,
        };
        let status_line = stream.read_line_crlf()?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .filter(|_| status_line.starts_with("HTTP/1."))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not an HTTP status line: {status_line:?}"),
                )
            })?;
        let mut length = None;
        loop {
            let line = stream.read_line_crlf()?;
            if line.is_empty() {
                break;
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("transfer-encoding")
                && value.eq_ignore_ascii_case("chunked")
            {
                stream.chunked = true;
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            }
        }
        if !stream.chunked {
            stream.left = length.unwrap_or(0);
            stream.done = stream.left == 0;
        }
        Ok((status, stream))
    }

    /// The next body bytes into `out`; false at the end of the body.
    fn read_some(&mut self, out: &mut Vec<u8>) -> io::Result<bool> {
        if self.done {
            return Ok(false);
        }
        if self.left == 0 {
            // Only chunked bodies get here: the next chunk's size line.
            let line = self.read_line_crlf()?;
            let size = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad chunk size {line:?}"),
                )
            })?;
            if size == 0 {
                self.done = true;
                return Ok(false);
            }
            self.left = size;
        }
        let mut buf = vec![0u8; self.left.min(64 * 1024)];
        let n = self.reader.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream ended inside a chunk",
            ));
        }
        out.extend_from_slice(&buf[..n]);
        self.left -= n;
        if self.left == 0 {
            if self.chunked {
                // The CRLF after the chunk's data.
                let rest = self.read_line_crlf()?;
                if !rest.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "chunk data longer than its size",
                    ));
                }
            } else {
                self.done = true;
            }
        }
        Ok(true)
    }
}

/// Splits a body into lines (one JSON message each).
struct Lines {
    stream: Stream,
    pending: Vec<u8>,
}

impl Lines {
    /// The next non-empty line; `None` at the end of the body.
    fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(at) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=at).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            if self.pending.len() > WATCH_LINE_BYTES_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a watch message is longer than 256 MiB",
                ));
            }
            if !self.stream.read_some(&mut self.pending)? {
                if self.pending.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                return Ok(Some(std::mem::take(&mut self.pending)));
            }
        }
    }
}

/// What one watch message says.
enum WatchMessage {
    Created,
    Events(Vec<WatchEvent>),
    /// The watch ended: why.
    Ended(String),
}

fn parse_watch_message(line: &[u8], prefix: &str) -> Result<WatchMessage, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        format!(
            "not JSON ({e}): {:?}",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        )
    })?;
    if let Some(error) = value.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_owned);
        return Ok(WatchMessage::Ended(format!(
            "etcd ended the watch: {message}"
        )));
    }
    let result = value
        .get("result")
        .filter(|r| r.is_object())
        .ok_or_else(|| format!("no result object in {value}"))?;
    if bool_field(result, "canceled")? {
        let compacted = int_field(result, "compact_revision")?;
        let reason = result
            .get("cancel_reason")
            .and_then(Value::as_str)
            .unwrap_or("");
        return Ok(WatchMessage::Ended(if compacted > 0 {
            format!(
                "etcd canceled the watch: the revisions asked for were compacted (up to \
                 {compacted})"
            )
        } else {
            format!("etcd canceled the watch {reason}")
        }));
    }
    if bool_field(result, "created")? {
        return Ok(WatchMessage::Created);
    }
    let mut events = Vec::new();
    for event in array_field(result, "events")? {
        let kv = event
            .get("kv")
            .ok_or_else(|| format!("an event without kv: {event}"))?;
        let (full, value, revision) = parse_kv(kv)?;
        let key = full
            .strip_prefix(prefix.as_bytes())
            .and_then(|rest| String::from_utf8(rest.to_vec()).ok())
            .ok_or_else(|| {
                format!(
                    "event key {:?} is not a UTF-8 key under {prefix:?}",
                    String::from_utf8_lossy(&full)
                )
            })?;
        match event.get("type").and_then(Value::as_str) {
            None | Some("PUT") => events.push(WatchEvent::Put {
                key,
                value,
                revision,
            }),
            Some("DELETE") => events.push(WatchEvent::Delete { key, revision }),
            Some(other) => return Err(format!("unknown event type {other:?}")),
        }
    }
    Ok(WatchMessage::Events(events))
}

impl Watch {
    fn open(endpoint: &Endpoint, config: &EtcdConfig, body: &str) -> Result<Watch, WatchOpenError> {
        let failed = |detail: String| {
            WatchOpenError::Failed(StoreError::Unavailable(format!(
                "etcd at {}: watch failed: {detail}",
                endpoint.url
            )))
        };
        let addrs: Vec<_> = endpoint
            .authority
            .to_socket_addrs()
            .map_err(WatchOpenError::NotSent)?
            .collect();
        let mut socket = None;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, config.timeout) {
                Ok(s) => {
                    socket = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let socket = socket.ok_or(WatchOpenError::NotSent(last))?;
        let io_failed = |e: io::Error| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                failed(format!(
                    "no answer within {:?} creating the watch",
                    config.timeout
                ))
            } else {
                failed(e.to_string())
            }
        };
        let _ = socket.set_nodelay(true);
        socket
            .set_read_timeout(Some(config.timeout))
            .and_then(|()| socket.set_write_timeout(Some(config.timeout)))
            .map_err(io_failed)?;
        let request = format!(
            "POST /v3/watch HTTP/1.1\r\nHost: {}\r\nUser-Agent: rowankv-cm\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            endpoint.authority,
            body.len()
        );
        (&socket).write_all(request.as_bytes()).map_err(io_failed)?;
        let reader_socket = socket.try_clone().map_err(io_failed)?;
        let (status, stream) = Stream::open(BufReader::new(reader_socket)).map_err(io_failed)?;
        let mut lines = Lines {
            stream,
            pending: Vec::new(),
        };
        if status != 200 {
            let mut text = Vec::new();
            while text.len() < 4096 {
                match lines.stream.read_some(&mut text) {
                    Ok(true) => {}
                    _ => break,
                }
            }
            return Err(failed(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&text)
            )));
        }
        // The first message confirms the watch; events come after it. (Each read
        // is bounded by the socket's read timeout.)
        let prefix = config.prefix.clone();
        let line = match lines.next_line() {
            Ok(Some(line)) => line,
            Ok(None) => {
                return Err(failed(
                    "the stream ended before the watch was created".to_owned(),
                ))
            }
            Err(e) => return Err(io_failed(e)),
        };
        match parse_watch_message(&line, &prefix) {
            Ok(WatchMessage::Created) => {}
            Ok(WatchMessage::Ended(why)) => return Err(failed(why)),
            Ok(WatchMessage::Events(_)) => {
                return Err(failed("events before the watch was created".to_owned()))
            }
            Err(detail) => return Err(failed(format!("malformed answer: {detail}"))),
        }
        // From here on the thread waits for events as long as they take.
        socket.set_read_timeout(None).map_err(io_failed)?;
        let (sender, events) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let thread_closing = closing.clone();
        let url = endpoint.url.clone();
        let thread = std::thread::Builder::new()
            .name("etcd-watch".to_owned())
            .spawn(move || watch_loop(lines, &prefix, &url, &sender, &thread_closing))
            .map_err(|e| failed(format!("cannot start the watch thread: {e}")))?;
        Ok(Watch {
            events,
            socket,
            closing,
            thread: Some(thread),
        })
    }

    /// The next event, waiting at most `timeout`: `Ok(None)` if none came. After
    /// an `Err` (the stream ended) there is nothing more.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<WatchEvent>, StoreError> {
        match self.events.recv_timeout(timeout) {
            Ok(event) => event.map(Some),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(StoreError::Unavailable("the watch has ended".to_owned()))
            }
        }
    }

    /// The events as they come (blocking); ends after the stream does.
    pub fn events(&self) -> &mpsc::Receiver<Result<WatchEvent, StoreError>> {
        &self.events
    }
}

fn watch_loop(
    mut lines: Lines,
    prefix: &str,
    url: &str,
    sender: &mpsc::Sender<Result<WatchEvent, StoreError>>,
    closing: &AtomicBool,
) {
    let ended = |why: String| StoreError::Unavailable(format!("etcd at {url}: {why}"));
    loop {
        let line = match lines.next_line() {
            Ok(Some(line)) => line,
            Ok(None) => {
                if !closing.load(Ordering::SeqCst) {
                    let _ = sender.send(Err(ended("the watch stream ended".to_owned())));
                }
                return;
            }
            Err(e) => {
                if !closing.load(Ordering::SeqCst) {
                    let _ = sender.send(Err(ended(format!("the watch stream broke: {e}"))));
                }
                return;
            }
        };
        match parse_watch_message(&line, prefix) {
            Ok(WatchMessage::Created) => {}
            Ok(WatchMessage::Events(events)) => {
                for event in events {
                    if sender.send(Ok(event)).is_err() {
                        return;
                    }
                }
            }
            Ok(WatchMessage::Ended(why)) => {
                let _ = sender.send(Err(ended(why)));
                return;
            }
            Err(detail) => {
                let _ = sender.send(Err(ended(format!(
                    "malformed answer on the watch stream: {detail}"
                ))));
                return;
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        // Unblocks the thread's read.
        let _ = self.socket.shutdown(Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_below_0xff() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn endpoints_parse_or_are_refused() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:2379/").unwrap().authority,
            "127.0.0.1:2379"
        );
        assert_eq!(
            parse_endpoint("localhost:2379").unwrap().url,
            "http://localhost:2379"
        );
        assert!(parse_endpoint("https://h:1").unwrap_err().contains("TLS"));
        assert!(parse_endpoint("unix://x").is_err());
        assert!(parse_endpoint("http://host").is_err());
        assert!(parse_endpoint("http://h:1/path").is_err());
    }

    #[test]
    fn int64_fields_are_strings_numbers_or_absent() {
        let v = json!({ "a": "12", "b": 7, "c": "-1", "d": "x", "e": true });
        assert_eq!(i64_field(&v, "a"), Ok(12));
        assert_eq!(i64_field(&v, "b"), Ok(7));
        assert_eq!(i64_field(&v, "c"), Ok(-1));
        assert_eq!(i64_field(&v, "missing"), Ok(0));
        assert!(i64_field(&v, "d").is_err());
        assert!(i64_field(&v, "e").is_err());
        assert!(int_field(&v, "c").is_err());
        assert_eq!(
            bytes_field(&json!({ "k": "aGk=" }), "k"),
            Ok(b"hi".to_vec())
        );
        assert!(bytes_field(&json!({ "k": "!!" }), "k").is_err());
    }

    #[test]
    fn watch_messages_parse() {
        let created = br#"{"result":{"header":{"revision":"3"},"created":true}}"#;
        assert!(matches!(
            parse_watch_message(created, "/p/"),
            Ok(WatchMessage::Created)
        ));
        let events = br#"{"result":{"events":[{"kv":{"key":"L3AvYQ==","mod_revision":"4","value":"aGk="}},{"type":"DELETE","kv":{"key":"L3AvYQ==","mod_revision":"5"}}]}}"#;
        match parse_watch_message(events, "/p/") {
            Ok(WatchMessage::Events(events)) => assert_eq!(
                events,
                vec![
                    WatchEvent::Put {
                        key: "a".to_owned(),
                        value: b"hi".to_vec(),
                        revision: 4
                    },
                    WatchEvent::Delete {
                        key: "a".to_owned(),
                        revision: 5
                    }
                ]
            ),
            _ => panic!("expected events"),
        }
        // A key outside the prefix, or junk, is malformed.
        assert!(parse_watch_message(events, "/q/").is_err());
        assert!(parse_watch_message(b"{\"result\":", "/p/").is_err());
        let canceled = br#"{"result":{"canceled":true,"compact_revision":"9"}}"#;
        assert!(matches!(
            parse_watch_message(canceled, "/p/"),
            Ok(WatchMessage::Ended(why)) if why.contains("compacted")
        ));
    }
}
