//! Bad input against a running in-process RowanKV cluster: frames that are
//! malformed, truncated, of an unknown type or version, oversized keys and values,
//! stale terms and other clusters' ids, requests to a server that is not the
//! shard's primary, replication RPCs with corrupted entries, segment grants that
//! seal what was never granted, and forged answers.
//!
//! A bad request must get a clear, typed error to its sender (carrying the request
//! id when the header could be read); a response nobody asked for gets no answer,
//! and a forged one must not stand in for a backup's. None may change anything
//! stored or stop the server: the tests end by reading a key written before the
//! bad input (same value, same version) and by writing and reading a new one.
//!
//! Raw frames travel on a client's endpoint (`send_bytes`) to the worker the client
//! is connected to; the answer is read by polling that endpoint.

#[allow(dead_code)] // each test file uses part of the helpers
mod common;
use common::recover_power_failure_image;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rowankv_client::{Client, ClientConfig, ClientError, Completed, Op, Output};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_engine::entry::{self, Kind};
use rowankv_fabric::{FaultInjector, LoopbackNic};
use rowankv_rpc::endpoint::{Endpoint, EndpointConfig, Event, PeerId};
use rowankv_server::control::CONTROL_PORT;
use rowankv_server::{ServerSettings, ServerShared, ServerStats, Strategy};
use rowankv_types::{NodeId, ShardId, Term, Version};
use rowankv_wire::config::{Config, ConfigError, ConfigSource};
use rowankv_wire::frame::{
    self, Body, Envelope, ErrorCode, MsgType, Response, FRAME_BYTES_MAX_DEFAULT, HEADER_BYTES,
    KEY_BYTES_MAX, KV_BYTES_MAX, MAGIC, WIRE_VERSION,
};

const SERVERS: usize = 3;
const WORKERS: usize = 3;
const SHARDS_PER_SERVER: u16 = 4;
const POOL_BYTES: usize = 64 << 20;
const SEGMENT_BYTES: usize = 1 << 20;
/// How long to wait for the answer to a raw frame.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a frame that must not be answered is given to be answered anyway.
const SILENCE: Duration = Duration::from_millis(200);
/// Raw request ids start here, far from the client's own.
const RAW_REQUEST_ID_BASE: u64 = 0x7261_7700_0000;
/// The anchor: a key written before any bad input, checked after.
const ANCHOR_KEY: &[u8] = b"anchor";
const ANCHOR_VALUE: &[u8] = b"written before the bad input";
/// A CommitVer period no test reaches: the records stay off.
const COMMIT_VER_OFF_NS: u64 = 3_600_000_000_000;

fn start(strategy: Strategy, settings: ServerSettings, crash_sim: bool) -> Cluster {
    Cluster::start(ClusterConfig {
        strategy,
        servers: SERVERS,
        shards_per_server: SHARDS_PER_SERVER,
        replication_factor: SERVERS as u8,
        pool_bytes: POOL_BYTES,
        segment_bytes: SEGMENT_BYTES,
        crash_sim,
        keys_per_shard_expected: 1024,
        settings: ServerSettings {
            workers: WORKERS,
            failover: common::steady_leases(),
            ..settings
        },
        ..ClusterConfig::default()
    })
    .unwrap_or_else(|e| panic!("{strategy}: {e}"))
}

fn connect(
    cluster: &mut Cluster,
    source: Arc<dyn ConfigSource>,
    worker_hint: usize,
) -> Client<LoopbackNic> {
    let nic = cluster.attach_client().expect("attaching a client");
    Client::connect(
        nic,
        cluster.directory().clone(),
        source,
        ClientConfig {
            worker_hint,
            timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        },
    )
    .expect("connecting a client")
}

/// Every counter of one server, to compare before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    puts: u64,
    dels: u64,
    gets: u64,
    replicated_in: u64,
    grants: u64,
    rejected_stale_term: u64,
    rejected_not_primary: u64,
    rejected_malformed: u64,
    rejected_too_large: u64,
    rejected_other: u64,
}

impl Counters {
    fn of(server: &ServerShared<LoopbackNic>) -> Counters {
        let s = &server.stats;
        Counters {
            puts: ServerStats::get(&s.puts),
            dels: ServerStats::get(&s.dels),
            gets: ServerStats::get(&s.gets),
            replicated_in: ServerStats::get(&s.replicated_in),
            grants: ServerStats::get(&s.grants),
            rejected_stale_term: ServerStats::get(&s.rejected_stale_term),
            rejected_not_primary: ServerStats::get(&s.rejected_not_primary),
            rejected_malformed: ServerStats::get(&s.rejected_malformed),
            rejected_too_large: ServerStats::get(&s.rejected_too_large),
            rejected_other: ServerStats::get(&s.rejected_other),
        }
    }

    fn all(cluster: &Cluster) -> Vec<Counters> {
        cluster.servers().iter().map(|s| Counters::of(s)).collect()
    }
}

/// Wait until no counter of any server moves for a while: the roles' own traffic
/// after a write (CommitVer records, segment grants) is over, so that a test can
/// attribute every counter change to its own frames.
fn settle(cluster: &Cluster) {
    const QUIET: Duration = Duration::from_millis(60);
    const SETTLE_MAX: Duration = Duration::from_secs(5);
    let deadline = Instant::now() + SETTLE_MAX;
    let mut last = Counters::all(cluster);
    loop {
        thread::sleep(QUIET);
        let now = Counters::all(cluster);
        if now == last {
            return;
        }
        assert!(Instant::now() < deadline, "the cluster never went quiet");
        last = now;
    }
}

/// A cluster, a client, and the means to send it raw frames.
struct Probe {
    cluster: Cluster,
    client: Client<LoopbackNic>,
    config: Arc<Config>,
    /// The anchor's version.
    anchor_version: u64,
    next_raw_request: u64,
    events: Vec<Event>,
    data: Vec<u8>,
    /// When set, raw frames go over connections from this server's machine.
    via_server: Option<(NodeId, Endpoint<LoopbackNic>, HashMap<NodeId, PeerId>)>,
}

impl Probe {
    /// No CommitVer records: with the `rpc` strategy each is a `Replicate` to every
    /// backup, which would move counters at any time after a write.
    fn start(strategy: Strategy) -> Probe {
        let settings = ServerSettings {
            commit_interval_ns: COMMIT_VER_OFF_NS,
            ..ServerSettings::default()
        };
        Probe::with(start(strategy, settings, false))
    }

    /// Writes the anchor.
    fn with(mut cluster: Cluster) -> Probe {
        let source = cluster.config_source();
        let mut client = connect(&mut cluster, source, 0);
        let anchor_version = client
            .put(ANCHOR_KEY, ANCHOR_VALUE)
            .expect("the anchor PUT");
        settle(&cluster);
        let config = cluster.cm().current();
        Probe {
            cluster,
            client,
            config,
            anchor_version,
            next_raw_request: RAW_REQUEST_ID_BASE,
            events: Vec::new(),
            data: Vec::new(),
            via_server: None,
        }
    }

    /// Send raw frames from now on over connections from `server`'s machine to
    /// `port` (a worker, or the control role) of every other server, as a process
    /// of that server would.
    fn send_from_server(&mut self, server: NodeId, port: u16) {
        let nic = self.cluster.server_nic(server.0 as usize);
        let mut ep = Endpoint::new(nic, EndpointConfig::default()).expect("endpoint");
        let mut peers = HashMap::new();
        for m in &self.config.members {
            if m.node != server {
                let peer = self
                    .cluster
                    .directory()
                    .connect(&mut ep, m.node, port, Duration::from_secs(5))
                    .expect("connecting from the server's machine");
                peers.insert(m.node, peer);
            }
        }
        self.via_server = Some((server, ep, peers));
    }

    fn strategy(&self) -> Strategy {
        self.cluster.config().strategy
    }

    fn server(&self, node: NodeId) -> &ServerShared<LoopbackNic> {
        &self.cluster.servers()[node.0 as usize]
    }

    fn counters(&self) -> Vec<Counters> {
        Counters::all(&self.cluster)
    }

    /// A valid envelope from the client with a fresh request id.
    fn envelope(&mut self) -> Envelope {
        let request_id = self.next_raw_request;
        self.next_raw_request += 1;
        Envelope {
            cluster_id: self.config.cluster_id,
            term: self.config.term,
            request_id,
            sender: self.client.node(),
        }
    }

    fn send(&mut self, to: NodeId, bytes: &[u8]) {
        if let Some((_, ep, peers)) = &mut self.via_server {
            ep.send_bytes(peers[&to], bytes)
                .unwrap_or_else(|e| panic!("sending {} raw bytes to {to}: {e}", bytes.len()));
            return;
        }
        let peer = self
            .client
            .server_peer(to)
            .expect("connected to every server");
        self.client
            .endpoint_mut()
            .send_bytes(peer, bytes)
            .unwrap_or_else(|e| panic!("sending {} raw bytes to {to}: {e}", bytes.len()));
    }

    /// The next message the client's endpoint receives, within `timeout`.
    fn receive(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            match &mut self.via_server {
                Some((_, ep, _)) => ep.poll(&mut self.events, &mut self.data),
                None => self
                    .client
                    .endpoint_mut()
                    .poll(&mut self.events, &mut self.data),
            }
            .expect("polling the probe's endpoint");
            let message = self.events.iter().find_map(|ev| match *ev {
                Event::Message { start, len, .. } => Some(self.data[start..start + len].to_vec()),
                _ => None,
            });
            if message.is_some() {
                return message;
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::yield_now();
        }
    }

    /// Send `bytes` to `to` and return the decoded error it is answered with:
    /// (request id echoed, code, server's term, detail).
    fn error_for(
        &mut self,
        to: NodeId,
        bytes: &[u8],
        what: &str,
    ) -> (u64, ErrorCode, Term, String) {
        self.send(to, bytes);
        let answer = self
            .receive(ANSWER_TIMEOUT)
            .unwrap_or_else(|| panic!("{what}: {to} did not answer within {ANSWER_TIMEOUT:?}"));
        let f = frame::decode(&answer)
            .unwrap_or_else(|e| panic!("{what}: the answer does not decode: {e}"));
        match f.body {
            Body::Response(Response::Error { code, term, detail }) => {
                assert!(!detail.is_empty(), "{what}: an error without a detail");
                (f.header.request_id, code, term, detail.to_string())
            }
            other => panic!("{what}: expected an error, got {other:?}"),
        }
    }

    /// Send `bytes` and check the error: its code, the request id it carries, the
    /// server's term. Returns the detail.
    fn expect_error(
        &mut self,
        to: NodeId,
        bytes: &[u8],
        code: ErrorCode,
        request_id: u64,
        what: &str,
    ) -> String {
        let (id, got, term, detail) = self.error_for(to, bytes, what);
        assert_eq!(got, code, "{what}: wrong code (detail: {detail})");
        assert_eq!(
            id, request_id,
            "{what}: wrong request id (detail: {detail})"
        );
        assert_eq!(term, self.server(to).term(), "{what}: the server's term");
        detail
    }

    /// Send `bytes` and expect no answer at all.
    fn expect_silence(&mut self, to: NodeId, bytes: &[u8], what: &str) {
        self.send(to, bytes);
        if let Some(answer) = self.receive(SILENCE) {
            panic!(
                "{what}: expected no answer, got {:?}",
                frame::decode(&answer)
            );
        }
    }

    /// Send `bytes` and expect `Ok`.
    fn expect_ok(&mut self, to: NodeId, bytes: &[u8], what: &str) {
        self.send(to, bytes);
        let answer = self
            .receive(ANSWER_TIMEOUT)
            .unwrap_or_else(|| panic!("{what}: {to} did not answer"));
        match frame::decode(&answer).map(|f| f.body) {
            Ok(Body::Response(Response::Ok { .. })) => {}
            other => panic!("{what}: expected Ok, got {other:?}"),
        }
    }

    /// The anchor is unchanged everywhere it is stored, and the cluster still
    /// serves a new write.
    fn finish(mut self) {
        let who = self.strategy();
        let anchor = self.client.execute(Op::Get {
            key: ANCHOR_KEY.to_vec(),
        });
        assert_eq!(
            anchor,
            Ok(Output::Value {
                value: ANCHOR_VALUE.to_vec(),
                version: self.anchor_version,
                expires_at_ms: None,
            }),
            "{who}: the anchor changed"
        );
        let s = self.config.shard_for_key(ANCHOR_KEY).clone();
        assert_eq!(
            self.server(s.primary)
                .engine
                .get(s.shard, ANCHOR_KEY)
                .unwrap(),
            Some((ANCHOR_VALUE.to_vec(), Version(self.anchor_version))),
            "{who}: the anchor in the primary's engine"
        );
        let version = self
            .client
            .put(b"after the bad input", b"still serving")
            .unwrap_or_else(|e| panic!("{who}: a PUT after the bad input: {e}"));
        assert!(version > 0);
        assert_eq!(
            self.client.get(b"after the bad input").as_deref(),
            Ok(&b"still serving"[..]),
            "{who}: a GET after the bad input"
        );
        self.cluster.shutdown();
    }
}

fn encode(env: &Envelope, body: &Body<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    frame::encode(&mut out, env, body, FRAME_BYTES_MAX_DEFAULT).expect("a valid frame");
    out
}

/// A frame built by hand: any type byte, any body, the header otherwise valid.
fn raw_frame(msg_type: u8, env: &Envelope, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER_BYTES + body.len());
    b.extend_from_slice(&MAGIC);
    b.push(WIRE_VERSION);
    b.push(msg_type);
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&env.cluster_id.to_le_bytes());
    b.extend_from_slice(&env.term.0.to_le_bytes());
    b.extend_from_slice(&env.request_id.to_le_bytes());
    b.extend_from_slice(&env.sender.0.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    assert_eq!(b.len(), HEADER_BYTES);
    b.extend_from_slice(body);
    b
}

/// A Put body built by hand, so that its lengths may break the limits. It
/// carries no request record (the record's bytes all zero).
fn raw_put_body(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; rowankv_wire::frame::REQUEST_BYTES];
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&(value.len() as u32).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b
}

fn delta(before: &[Counters], after: &[Counters]) -> Vec<(usize, Counters)> {
    before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(_, (b, a))| b != a)
        .map(|(i, (b, a))| {
            (
                i,
                Counters {
                    puts: a.puts - b.puts,
                    dels: a.dels - b.dels,
                    gets: a.gets - b.gets,
                    replicated_in: a.replicated_in - b.replicated_in,
                    grants: a.grants - b.grants,
                    rejected_stale_term: a.rejected_stale_term - b.rejected_stale_term,
                    rejected_not_primary: a.rejected_not_primary - b.rejected_not_primary,
                    rejected_malformed: a.rejected_malformed - b.rejected_malformed,
                    rejected_too_large: a.rejected_too_large - b.rejected_too_large,
                    rejected_other: a.rejected_other - b.rejected_other,
                },
            )
        })
        .collect()
}

/// Exactly one counter of exactly one server rose, by one.
fn assert_only(
    before: &[Counters],
    after: &[Counters],
    server: NodeId,
    expected: Counters,
    what: &str,
) {
    assert_eq!(
        delta(before, after),
        vec![(server.0 as usize, expected)],
        "{what}: counters that changed (server index, by how much)"
    );
}

fn one_malformed() -> Counters {
    Counters {
        rejected_malformed: 1,
        ..Counters::default()
    }
}

/// A key of a shard whose primary is `primary`, and that shard.
fn key_with_primary(config: &Config, primary: NodeId, prefix: &str) -> (Vec<u8>, ShardId) {
    (0u32..)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .find_map(|k| {
            let s = config.shard_for_key(&k);
            (s.primary == primary).then(|| (k.clone(), s.shard))
        })
        .expect("some key lands on every primary")
}

#[test]
fn malformed_and_truncated_frames_get_a_malformed_error() {
    let mut p = Probe::start(Strategy::Rowan);
    let s = p.config.shard_for_key(b"victim").clone();
    let target = s.primary;
    let put_env = p.envelope();
    let good_put = encode(
        &put_env,
        &Body::Put {
            expires_at_ms: None,
            key: b"victim",
            value: b"never stored",
            request: None,
        },
    );

    // (what, bytes, request id the answer must carry: 0 when the header is unreadable)
    let mut garbage: Vec<u8> = (0..96u32).map(|i| (i * 37 + 11) as u8).collect();
    garbage[0] = 0xde;
    let mut cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("garbage", garbage, 0),
        ("a few bytes", vec![0x52, 0x4b, 0x01], 0),
        ("a Put cut inside its header", good_put[..20].to_vec(), 0),
        (
            "a Put cut inside its body",
            good_put[..good_put.len() - 3].to_vec(),
            put_env.request_id,
        ),
        (
            "a Put cut right after its header",
            good_put[..HEADER_BYTES].to_vec(),
            put_env.request_id,
        ),
    ];
    let mut bad_magic = good_put.clone();
    bad_magic[..2].copy_from_slice(b"XX");
    cases.push(("bad magic", bad_magic, 0));
    let mut bad_version = good_put.clone();
    bad_version[2] = WIRE_VERSION + 1;
    cases.push(("wrong wire version", bad_version, 0));
    let mut reserved = good_put.clone();
    reserved[38] = 1;
    cases.push(("non-zero reserved bytes", reserved, 0));
    let mut trailing = good_put.clone();
    trailing.extend_from_slice(&[1, 2, 3]);
    cases.push((
        "bytes after the declared body",
        trailing,
        put_env.request_id,
    ));
    // Body length agrees with the frame, but the value length points past the end.
    let mut body = raw_put_body(b"victim", b"short");
    let at = rowankv_wire::frame::REQUEST_BYTES + 2;
    body[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
    let env = p.envelope();
    cases.push((
        "a value length past the body",
        raw_frame(MsgType::Put as u8, &env, &body),
        env.request_id,
    ));
    let env = p.envelope();
    cases.push((
        "a Get with a key length past the body",
        raw_frame(MsgType::Get as u8, &env, &[200, 0, b'k']),
        env.request_id,
    ));
    let env = p.envelope();
    cases.push((
        "a GrantSegment with has_sealed = 2",
        raw_frame(
            MsgType::GrantSegment as u8,
            &env,
            &[0, 0, 0, 0, 2, 0, 0, 0, 0],
        ),
        env.request_id,
    ));

    for (what, bytes, request_id) in cases {
        let before = p.counters();
        let detail = p.expect_error(target, &bytes, ErrorCode::Malformed, request_id, what);
        assert_only(&before, &p.counters(), target, one_malformed(), what);
        eprintln!("{what}: {detail}");
    }
    // Nothing of the victim was stored anywhere.
    for &node in std::iter::once(&s.primary).chain(&s.backups) {
        assert_eq!(p.server(node).engine.get(s.shard, b"victim").unwrap(), None);
    }
    assert_eq!(p.client.get(b"victim"), Err(ClientError::NotFound));
    p.finish();
}

#[test]
fn an_unknown_message_type_gets_unknown_type_with_its_request_id() {
    let mut p = Probe::start(Strategy::Rowan);
    for node in (0..SERVERS as u32).map(NodeId) {
        for msg_type in [0u8, 22, 99, 0x7f, 0x81, 0xff] {
            let env = p.envelope();
            let bytes = raw_frame(msg_type, &env, b"whatever the body");
            let what = format!("type {msg_type} to {node}");
            let before = p.counters();
            p.expect_error(node, &bytes, ErrorCode::UnknownType, env.request_id, &what);
            assert_only(&before, &p.counters(), node, one_malformed(), &what);
        }
    }
    p.finish();
}

#[test]
fn stray_responses_are_dropped_without_an_answer() {
    let mut p = Probe::start(Strategy::Rpc);
    let target = NodeId(1);
    let env = p.envelope();
    let ok = encode(&env, &Body::Response(Response::Ok { version: 7 }));
    let before = p.counters();
    p.expect_silence(target, &ok, "an Ok nobody asked for");
    // An unreadable response: nobody to tell.
    let env = p.envelope();
    let bad = raw_frame(MsgType::Response as u8, &env, &[42]);
    p.expect_silence(target, &bad, "a response with status 42");
    assert_eq!(
        delta(&before, &p.counters()),
        vec![],
        "stray responses change no counter"
    );
    p.finish();
}

#[test]
fn oversized_keys_and_values_sent_raw_get_too_large() {
    let mut p = Probe::start(Strategy::Rowan);
    let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
    let too_large = Counters {
        rejected_too_large: 1,
        ..Counters::default()
    };
    for node in (0..SERVERS as u32).map(NodeId) {
        // A key over the limit is refused by the decoder, on any server.
        let env = p.envelope();
        let put = raw_frame(MsgType::Put as u8, &env, &raw_put_body(&long_key, b"v"));
        let before = p.counters();
        let what = format!("a Put of a {} B key to {node}", long_key.len());
        p.expect_error(node, &put, ErrorCode::TooLarge, env.request_id, &what);
        assert_only(&before, &p.counters(), node, too_large, &what);

        let env = p.envelope();
        let mut body = (long_key.len() as u16).to_le_bytes().to_vec();
        body.extend_from_slice(&long_key);
        let get = raw_frame(MsgType::Get as u8, &env, &body);
        let before = p.counters();
        let what = format!("a Get of a {} B key to {node}", long_key.len());
        p.expect_error(node, &get, ErrorCode::TooLarge, env.request_id, &what);
        assert_only(&before, &p.counters(), node, too_large, &what);
    }

    // key + value one byte over: the frame itself fits, the primary refuses it.
    let key = b"big-value".to_vec();
    let s = p.config.shard_for_key(&key).clone();
    let value = vec![0xab; KV_BYTES_MAX - key.len() + 1];
    let env = p.envelope();
    let put = encode(
        &env,
        &Body::Put {
            expires_at_ms: None,
            key: &key,
            value: &value,
            request: None,
        },
    );
    assert!(put.len() <= FRAME_BYTES_MAX_DEFAULT);
    let before = p.counters();
    p.expect_error(
        s.primary,
        &put,
        ErrorCode::TooLarge,
        env.request_id,
        "key + value over",
    );
    assert_only(
        &before,
        &p.counters(),
        s.primary,
        too_large,
        "key + value over",
    );
    for &node in std::iter::once(&s.primary).chain(&s.backups) {
        assert_eq!(p.server(node).engine.get(s.shard, &key).unwrap(), None);
    }
    assert_eq!(p.client.get(&key), Err(ClientError::NotFound));

    // Exactly at the limit it is a normal PUT.
    let value = vec![0xcd; KV_BYTES_MAX - key.len()];
    let env = p.envelope();
    let put = encode(
        &env,
        &Body::Put {
            expires_at_ms: None,
            key: &key,
            value: &value,
            request: None,
        },
    );
    p.expect_ok(s.primary, &put, "key + value at the limit");
    assert_eq!(p.client.get(&key), Ok(value));
    p.finish();
}

#[test]
fn the_client_refuses_oversized_operations_without_sending_them() {
    let mut p = Probe::start(Strategy::Rowan);
    let long_key = vec![b'k'; KEY_BYTES_MAX + 1];
    let before = p.counters();
    let is_too_large = |r: Result<_, ClientError>, what: &'static str| match r {
        Err(ClientError::TooLarge { what: w, .. }) if w == what => {}
        other => panic!("expected TooLarge({what}), got {other:?}"),
    };
    is_too_large(p.client.put(&long_key, b"v").map(|_| ()), "key");
    is_too_large(p.client.get(&long_key).map(|_| ()), "key");
    is_too_large(p.client.delete(&long_key).map(|_| ()), "key");
    let value = vec![1u8; KV_BYTES_MAX - 2];
    is_too_large(p.client.put(b"abc", &value).map(|_| ()), "key + value");
    is_too_large(p.client.put(b"", b"v").map(|_| ()), "empty key");
    assert_eq!(p.client.inflight(), 0);
    assert_eq!(
        delta(&before, &p.counters()),
        vec![],
        "refused before sending: no server saw anything"
    );
    p.finish();
}

#[test]
fn stale_terms_and_other_clusters_are_refused() {
    let mut p = Probe::start(Strategy::Rowan);
    assert_eq!(p.config.term, Term(1));
    let key = b"fenced".to_vec();
    let s = p.config.shard_for_key(&key).clone();
    let anchor = p.config.shard_for_key(ANCHOR_KEY).clone();
    let stale = Counters {
        rejected_stale_term: 1,
        ..Counters::default()
    };

    // Older than the cluster's term, and newer than any the CM has committed.
    for term in [Term(0), Term(2), Term(u64::MAX)] {
        let env = Envelope {
            term,
            ..p.envelope()
        };
        let put = encode(
            &env,
            &Body::Put {
                expires_at_ms: None,
                key: &key,
                value: b"from another term",
                request: None,
            },
        );
        let before = p.counters();
        let what = format!("a Put at {term:?}");
        let detail = p.expect_error(s.primary, &put, ErrorCode::StaleTerm, env.request_id, &what);
        assert_only(&before, &p.counters(), s.primary, stale, &what);
        eprintln!("{what}: {detail}");

        let env = Envelope {
            term,
            ..p.envelope()
        };
        let del = encode(
            &env,
            &Body::Del {
                key: ANCHOR_KEY,
                request: None,
            },
        );
        let before = p.counters();
        let what = format!("a Del of the anchor at {term:?}");
        p.expect_error(
            anchor.primary,
            &del,
            ErrorCode::StaleTerm,
            env.request_id,
            &what,
        );
        assert_only(&before, &p.counters(), anchor.primary, stale, &what);

        let env = Envelope {
            term,
            ..p.envelope()
        };
        let get = encode(&env, &Body::Get { key: ANCHOR_KEY });
        let what = format!("a Get at {term:?}");
        p.expect_error(
            anchor.primary,
            &get,
            ErrorCode::StaleTerm,
            env.request_id,
            &what,
        );
    }

    let env = Envelope {
        cluster_id: p.config.cluster_id ^ 1,
        ..p.envelope()
    };
    let put = encode(
        &env,
        &Body::Put {
            expires_at_ms: None,
            key: &key,
            value: b"from another cluster",
            request: None,
        },
    );
    let before = p.counters();
    p.expect_error(
        s.primary,
        &put,
        ErrorCode::WrongCluster,
        env.request_id,
        "another cluster",
    );
    let other = Counters {
        rejected_other: 1,
        ..Counters::default()
    };
    assert_only(&before, &p.counters(), s.primary, other, "another cluster");

    for &node in std::iter::once(&s.primary).chain(&s.backups) {
        assert_eq!(p.server(node).engine.get(s.shard, &key).unwrap(), None);
    }
    assert_eq!(p.client.get(&key), Err(ClientError::NotFound));
    p.finish();
}

#[test]
fn a_server_that_is_not_the_primary_refuses_with_not_primary() {
    let mut p = Probe::start(Strategy::Rowan);
    let key = b"misrouted".to_vec();
    let s = p.config.shard_for_key(&key).clone();
    let anchor = p.config.shard_for_key(ANCHOR_KEY).clone();
    let not_primary = Counters {
        rejected_not_primary: 1,
        ..Counters::default()
    };
    for &backup in &s.backups {
        let env = p.envelope();
        let put = encode(
            &env,
            &Body::Put {
                expires_at_ms: None,
                key: &key,
                value: b"misrouted",
                request: None,
            },
        );
        let before = p.counters();
        let what = format!("a Put to backup {backup}");
        let detail = p.expect_error(backup, &put, ErrorCode::NotPrimary, env.request_id, &what);
        assert_only(&before, &p.counters(), backup, not_primary, &what);
        eprintln!("{what}: {detail}");

        let env = p.envelope();
        let get = encode(&env, &Body::Get { key: &key });
        let what = format!("a Get to backup {backup}");
        p.expect_error(backup, &get, ErrorCode::NotPrimary, env.request_id, &what);
    }
    for &backup in &anchor.backups {
        let env = p.envelope();
        let del = encode(
            &env,
            &Body::Del {
                key: ANCHOR_KEY,
                request: None,
            },
        );
        let what = format!("a Del of the anchor to backup {backup}");
        p.expect_error(backup, &del, ErrorCode::NotPrimary, env.request_id, &what);
    }
    for &node in std::iter::once(&s.primary).chain(&s.backups) {
        assert_eq!(p.server(node).engine.get(s.shard, &key).unwrap(), None);
    }
    // Routed by the client, the same key goes to its primary.
    p.client.put(&key, b"routed").expect("a routed PUT");
    assert_eq!(p.client.get(&key).as_deref(), Ok(&b"routed"[..]));
    p.finish();
}

/// A configuration source that first serves a stale configuration, then the CM's.
struct StaleFirst {
    stale: Arc<Config>,
    cm: Arc<dyn ConfigSource>,
    served: AtomicBool,
}

impl ConfigSource for StaleFirst {
    fn fetch(&self) -> Result<Arc<Config>, ConfigError> {
        if self.served.swap(true, Ordering::SeqCst) {
            self.cm.fetch()
        } else {
            Ok(self.stale.clone())
        }
    }
}

#[test]
fn a_client_with_a_stale_configuration_is_fenced_and_rerouted() {
    let mut p = Probe::start(Strategy::Rowan);
    let key = b"moved".to_vec();
    let current = p.config.clone();
    let s = current.shard_for_key(&key).clone();
    // What an old term said: the shard's primary was its first backup.
    let mut stale = (*current).clone();
    {
        let a = &mut stale.shards[s.shard.0 as usize];
        std::mem::swap(&mut a.backups[0], &mut a.primary);
    }
    stale.validate().expect("a valid configuration");
    let wrong = stale.shards[s.shard.0 as usize].primary;
    // The cluster moves on to term 2 (same map). Wait until both servers hold
    // it (their lease roles learn the committed term from the CM), so that
    // what refuses the stale client below is its term.
    let next = Config {
        term: Term(2),
        ..(*current).clone()
    };
    p.cluster.cm().commit(next).expect("committing term 2");
    let deadline = Instant::now() + Duration::from_secs(10);
    for node in [wrong, s.primary] {
        while p.server(node).term() < Term(2) {
            assert!(Instant::now() < deadline, "{node} never learned term 2");
            thread::sleep(Duration::from_millis(1));
        }
    }

    let source = Arc::new(StaleFirst {
        stale: Arc::new(stale),
        cm: p.cluster.config_source(),
        served: AtomicBool::new(false),
    });
    let mut c = connect(&mut p.cluster, source, 1);
    assert_eq!(c.term(), Term(1));
    let before = Counters::of(p.server(wrong));
    let version = c.put(&key, b"rerouted").expect("the PUT is rerouted");
    let after = Counters::of(p.server(wrong));
    assert_eq!(c.term(), Term(2), "the client adopted the CM's term");
    assert_eq!(
        after.rejected_stale_term,
        before.rejected_stale_term + 1,
        "{wrong} refused the term-1 PUT once, as stale"
    );
    assert_eq!(after.puts, before.puts, "{wrong} stored nothing");
    assert_eq!(
        p.server(s.primary).engine.get(s.shard, &key).unwrap(),
        Some((b"rerouted".to_vec(), Version(version)))
    );

    // The primary refuses a term-1 request too.
    let env = Envelope {
        term: Term(1),
        ..p.envelope()
    };
    let put = encode(
        &env,
        &Body::Put {
            expires_at_ms: None,
            key: &key,
            value: b"from term 1",
            request: None,
        },
    );
    p.expect_error(
        s.primary,
        &put,
        ErrorCode::StaleTerm,
        env.request_id,
        "term 1 after term 2",
    );
    assert_eq!(c.get(&key).as_deref(), Ok(&b"rerouted"[..]));
    // The probe's own client refreshes too.
    p.config = p.cluster.cm().current();
    p.finish();
}

/// One encoded entry.
fn entry_bytes(kind: Kind, shard: ShardId, version: u64, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    entry::encode(
        &mut out,
        kind,
        shard,
        Version(version),
        key,
        value,
        entry::MTU_BYTES_DEFAULT,
    )
    .expect("a valid entry");
    out
}

#[test]
fn a_replicate_rpc_with_a_corrupt_entry_appends_nothing() {
    let mut p = Probe::start(Strategy::Rpc);
    let primary = NodeId(0);
    let (key, shard) = key_with_primary(&p.config, primary, "replicated-");
    let (other_key, _) = key_with_primary(&p.config, primary, "also-replicated-");
    let a = p.config.shard(shard).unwrap().clone();
    let backup = a.backups[0];
    let version = 1 << 40;
    let good = entry_bytes(Kind::Put, shard, version, &key, b"forged by a test");
    let mut corrupt = entry_bytes(Kind::Put, shard, version + 1, &other_key, b"bit rot");
    let at = entry::HEADER_BYTES + other_key.len() + 2;
    corrupt[at] ^= 0x40;
    let as_primary = |p: &mut Probe| Envelope {
        sender: primary,
        ..p.envelope()
    };
    // A process on the primary's machine: its connections really come from there.
    p.send_from_server(primary, 0);

    let malformed_cases: Vec<(&str, Vec<u8>)> = vec![
        ("a corrupt entry", corrupt.clone()),
        (
            "a good entry, then a corrupt one",
            [good.clone(), corrupt.clone()].concat(),
        ),
        (
            "a corrupt entry, then a good one",
            [corrupt.clone(), good.clone()].concat(),
        ),
    ];
    for (what, entries) in malformed_cases {
        let env = as_primary(&mut p);
        let bytes = encode(&env, &Body::Replicate { entries: &entries });
        let before = p.counters();
        let detail = p.expect_error(backup, &bytes, ErrorCode::Malformed, env.request_id, what);
        assert_only(&before, &p.counters(), backup, one_malformed(), what);
        eprintln!("{what}: {detail}");
    }
    // Not a whole number of 64 B strides: refused by the decoder.
    let env = as_primary(&mut p);
    let bytes = raw_frame(MsgType::Replicate as u8, &env, &good[..good.len() - 8]);
    p.expect_error(
        backup,
        &bytes,
        ErrorCode::Malformed,
        env.request_id,
        "a misaligned body",
    );
    // Naming another server as the sender than the one the connection comes from.
    let env = Envelope {
        sender: a.backups[1],
        ..p.envelope()
    };
    let bytes = encode(&env, &Body::Replicate { entries: &good });
    let detail = p.expect_error(
        backup,
        &bytes,
        ErrorCode::Malformed,
        env.request_id,
        "a sender other than the connection's",
    );
    assert!(detail.contains("sender"), "{detail}");
    // From an older term.
    let env = Envelope {
        term: Term(0),
        ..as_primary(&mut p)
    };
    let bytes = encode(&env, &Body::Replicate { entries: &good });
    p.expect_error(
        backup,
        &bytes,
        ErrorCode::StaleTerm,
        env.request_id,
        "an older term",
    );

    let before = p.counters();
    p.cluster.digest_everything().expect("digest");
    for k in [&key, &other_key] {
        assert_eq!(
            p.server(backup).engine.get(shard, k).unwrap(),
            None,
            "a refused Replicate left {:?} on {backup}",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(delta(&before, &p.counters()), vec![]);

    // Control: the same good entry alone is appended (so the refusals above were
    // the corruption's doing, and the check above could see an append).
    let env = as_primary(&mut p);
    let bytes = encode(&env, &Body::Replicate { entries: &good });
    let before = p.counters();
    p.expect_ok(backup, &bytes, "the good entry alone");
    let replicated = Counters {
        replicated_in: 1,
        ..Counters::default()
    };
    assert_only(
        &before,
        &p.counters(),
        backup,
        replicated,
        "the good entry alone",
    );
    p.cluster.digest_everything().expect("digest");
    assert_eq!(
        p.server(backup).engine.get(shard, &key).unwrap(),
        Some((b"forged by a test".to_vec(), Version(version)))
    );
    // The same entry from a client in the primary's name is refused: a backup
    // takes the sender from the connection, not from the header.
    p.via_server = None;
    let env = as_primary(&mut p);
    let bytes = encode(&env, &Body::Replicate { entries: &good });
    let detail = p.expect_error(
        backup,
        &bytes,
        ErrorCode::Malformed,
        env.request_id,
        "the good entry from a client, in the primary's name",
    );
    assert!(detail.contains("sender"), "{detail}");
    p.finish();
}

#[test]
fn replication_messages_of_another_strategy_are_malformed() {
    // Replicate RPCs to a cluster that replicates by Rowan.
    let mut p = Probe::start(Strategy::Rowan);
    let (key, shard) = key_with_primary(&p.config, NodeId(0), "wrong-strategy-");
    let good = entry_bytes(Kind::Put, shard, 1 << 40, &key, b"v");
    let env = Envelope {
        sender: NodeId(0),
        ..p.envelope()
    };
    let bytes = encode(&env, &Body::Replicate { entries: &good });
    let before = p.counters();
    p.expect_error(
        NodeId(1),
        &bytes,
        ErrorCode::Malformed,
        env.request_id,
        "Replicate to rowan",
    );
    assert_only(
        &before,
        &p.counters(),
        NodeId(1),
        one_malformed(),
        "Replicate to rowan",
    );
    p.finish();

    // Segment grants to a cluster that replicates by RPC.
    let mut p = Probe::start(Strategy::Rpc);
    let env = Envelope {
        sender: NodeId(0),
        ..p.envelope()
    };
    let bytes = encode(
        &env,
        &Body::GrantSegment {
            log: 0,
            sealed: None,
        },
    );
    let before = p.counters();
    p.expect_error(
        NodeId(1),
        &bytes,
        ErrorCode::Malformed,
        env.request_id,
        "GrantSegment to rpc",
    );
    assert_only(
        &before,
        &p.counters(),
        NodeId(1),
        one_malformed(),
        "GrantSegment to rpc",
    );
    p.finish();
}

#[test]
fn a_segment_grant_that_seals_what_was_never_granted_is_malformed() {
    let mut p = Probe::start(Strategy::Rwrite);
    let target = NodeId(1);
    let granted = p.server(target).granted_segments();
    assert!(
        !granted.is_empty(),
        "the other servers' workers hold segments of {target}"
    );
    let segment_count = p.server(target).engine.layout().segment_count as u32;
    let never_granted = (0..segment_count)
        .find(|s| !granted.contains(s))
        .expect("a segment not granted");
    let sealed_before = p.server(target).blog.sealed_segments();

    let cases: Vec<(&str, NodeId, u32, Option<u32>)> = vec![
        (
            "seals a segment never granted",
            NodeId(0),
            0,
            Some(never_granted),
        ),
        (
            "seals a segment that does not exist",
            NodeId(0),
            0,
            Some(u32::MAX - 1),
        ),
        (
            "names a log the sender does not have",
            NodeId(0),
            u32::MAX,
            None,
        ),
        ("comes from the server itself", target, 0, None),
        (
            "comes from a node that is not a server",
            p.client.node(),
            0,
            None,
        ),
    ];
    for (what, sender, log, sealed) in cases {
        let env = Envelope {
            sender,
            ..p.envelope()
        };
        let bytes = encode(&env, &Body::GrantSegment { log, sealed });
        let before = p.counters();
        let detail = p.expect_error(target, &bytes, ErrorCode::Malformed, env.request_id, what);
        assert_only(&before, &p.counters(), target, one_malformed(), what);
        eprintln!("a grant that {what}: {detail}");
    }
    assert_eq!(
        p.server(target).granted_segments(),
        granted,
        "grants unchanged"
    );
    assert_eq!(
        p.server(target).blog.sealed_segments(),
        sealed_before,
        "nothing queued as sealed"
    );
    p.finish();
}

/// Submit a PUT, then (if `forged` is given) send those bytes to the primary right
/// behind it on the same connection, and wait for the PUT's outcome. Returns the
/// version and how long the PUT took.
fn put_behind(
    c: &mut Client<LoopbackNic>,
    primary: NodeId,
    key: &[u8],
    value: &[u8],
    forged: Option<&[u8]>,
) -> (u64, Duration) {
    let submitted_at = Instant::now();
    let id = c
        .submit(Op::Put {
            expires_at_ms: None,
            key: key.to_vec(),
            value: value.to_vec(),
        })
        .expect("submit");
    if let Some(bytes) = forged {
        let peer = c.server_peer(primary).expect("connected");
        c.endpoint_mut().send_bytes(peer, bytes).expect("send");
    }
    let mut out: Vec<Completed> = Vec::new();
    let deadline = submitted_at + Duration::from_secs(10);
    let result = loop {
        c.poll(&mut out);
        if let Some(done) = out.iter().find(|d| d.id == id) {
            break done.result.clone();
        }
        assert!(Instant::now() < deadline, "the PUT never completed");
        thread::yield_now();
    };
    match result {
        Ok(Output::Written { version }) => (version, submitted_at.elapsed()),
        other => panic!("the PUT failed: {other:?}"),
    }
}

/// What a power failure of `node` now would leave of `key`, for display.
fn held_after_power_failure(
    cluster: &Cluster,
    node: NodeId,
    shard: ShardId,
    key: &[u8],
) -> Option<(String, Version)> {
    recover_power_failure_image(&cluster.servers()[node.0 as usize])
        .get(shard, key)
        .unwrap()
        .map(|(v, n)| (String::from_utf8_lossy(&v).into_owned(), n))
}

/// A worker takes a Response as the answer to its replication request only from
/// the connection the request went out on: a client answering in a backup's name
/// must not get a PUT acknowledged while that backup does not hold it.
#[test]
fn a_forged_backup_ack_does_not_acknowledge_a_write() {
    // No CommitVer records: they would take replication request ids.
    let settings = ServerSettings {
        commit_interval_ns: COMMIT_VER_OFF_NS,
        ..ServerSettings::default()
    };
    let mut cluster = start(Strategy::Rpc, settings, true);
    let source = cluster.config_source();
    let mut c = connect(&mut cluster, source, 0);
    let config = cluster.cm().current();
    let primary = NodeId(0);
    let (control_key, shard) = key_with_primary(&config, primary, "control-");
    let key = (0u32..)
        .map(|i| format!("forged-ack-{i}").into_bytes())
        .find(|k| config.shard_for_key(k).shard == shard)
        .expect("another key of the shard");
    let backups = config.shard(shard).unwrap().backups.clone();
    // The link to backups[0] is slow: its real answers are a while away.
    let slow = backups[0];
    let delay = Duration::from_millis(300);
    cluster
        .fabric()
        .set_delay_ns(primary, slow, delay.as_nanos() as u64);

    // Control: the first write of worker 0 of the primary. Its Replicate RPCs carry
    // request ids 1 (to backups[0]) and 2 (to backups[1]); it is acknowledged only
    // after the slow backup answered, and that backup then holds it.
    let value = "acknowledged only when every replica has it";
    let (version, took) = put_behind(&mut c, primary, &control_key, value.as_bytes(), None);
    assert!(took >= 2 * delay, "the control PUT took {took:?}");
    assert_eq!(
        held_after_power_failure(&cluster, slow, shard, &control_key),
        Some((value.to_owned(), Version(version))),
        "the control PUT on backup {slow}"
    );

    // The second write takes request ids 3 (slow backup) and 4. A client answers
    // id 3 in the slow backup's name, right behind the PUT.
    let forged = encode(
        &Envelope {
            cluster_id: config.cluster_id,
            term: config.term,
            request_id: 3,
            sender: slow,
        },
        &Body::Response(Response::Ok { version: 0 }),
    );
    let (version, took) = put_behind(&mut c, primary, &key, value.as_bytes(), Some(&forged));
    // The forged answer must be ignored: the PUT waits for the slow backup's own
    // answer, and its Ok promises the value on every replica now.
    let held = held_after_power_failure(&cluster, slow, shard, &key);
    cluster.fabric().set_delay_ns(primary, slow, 0);
    assert_eq!(
        held,
        Some((value.to_owned(), Version(version))),
        "PUT v{version} was acknowledged {took:?} after it was sent (the link to backup \
         {slow} delays each way by {delay:?}), after a forged answer in {slow}'s name, and \
         backup {slow} does not hold it"
    );
    assert_eq!(
        c.get(&key).as_deref(),
        Ok(value.as_bytes()),
        "the cluster still serves"
    );
    cluster.shutdown();
}

#[test]
fn a_gather_to_a_server_that_does_not_replicate_the_shard_gets_not_member() {
    // Three servers, two replicas per shard: each shard has a server outside it.
    let cluster = Cluster::start(ClusterConfig {
        strategy: Strategy::Rowan,
        servers: SERVERS,
        shards_per_server: SHARDS_PER_SERVER,
        replication_factor: 2,
        pool_bytes: POOL_BYTES,
        segment_bytes: SEGMENT_BYTES,
        keys_per_shard_expected: 1024,
        settings: ServerSettings {
            workers: WORKERS,
            failover: common::steady_leases(),
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster with two replicas per shard");
    let mut p = Probe::with(cluster);
    let primary = NodeId(0);
    let (shard, replica, outsider) = p
        .config
        .primary_shards(primary)
        .find_map(|s| {
            let replica = s.write_targets().next()?;
            let outsider = p
                .config
                .members
                .iter()
                .map(|m| m.node)
                .find(|n| *n != primary && !s.write_targets().any(|b| b == *n))?;
            Some((s.shard, replica, outsider))
        })
        .expect("a shard of n0 that some server does not replicate");
    // The primary's control role asks, as it does when it is promoted.
    p.send_from_server(primary, CONTROL_PORT);
    let gather = |p: &mut Probe| {
        let env = Envelope {
            sender: primary,
            ..p.envelope()
        };
        (
            env.request_id,
            encode(&env, &Body::Gather { shard, cursor: 0 }),
        )
    };

    // A replica pages out what it holds of the shard.
    let (_, bytes) = gather(&mut p);
    p.send(replica, &bytes);
    let answer = p
        .receive(ANSWER_TIMEOUT)
        .unwrap_or_else(|| panic!("replica {replica} did not answer the gather"));
    match frame::decode(&answer).map(|f| f.body) {
        Ok(Body::Response(Response::Entries { more: false, .. })) => {}
        other => panic!("the replica's answer: {other:?}"),
    }

    // A server outside the shard holds nothing of it to give: a typed refusal,
    // and it goes on serving (it once failed here when a promotion planned in an
    // earlier term asked it).
    let (id, bytes) = gather(&mut p);
    let detail = p.expect_error(
        outsider,
        &bytes,
        ErrorCode::NotMember,
        id,
        "Gather to a non-replica",
    );
    assert!(detail.contains("does not replicate"), "detail: {detail}");
    let (id, bytes) = gather(&mut p);
    p.expect_error(
        outsider,
        &bytes,
        ErrorCode::NotMember,
        id,
        "the same Gather again",
    );
    p.finish();
}

/// A segment request from a server that names a log it does not hold at the
/// target (one the target ended when another path of the sender arrived, or
/// never gave it) is refused `UnknownLog`, and nothing is granted or sealed:
/// the sender gives that path up and dials anew.
#[test]
fn a_segment_request_naming_a_log_the_sender_does_not_hold_is_refused() {
    let mut p = Probe::start(Strategy::Rwrite);
    let (sender, target) = (NodeId(0), NodeId(1));
    let held = p.server(target).remote_logs_of(sender);
    assert!(
        !held.is_empty(),
        "the sender's workers hold logs at {target}"
    );
    let not_held = (0u32..).find(|l| !held.contains(l)).expect("an id");
    p.send_from_server(sender, 0);
    let granted = p.server(target).granted_segments();
    let sealed_before = p.server(target).blog.sealed_segments();
    for sealed in [None, granted.first().copied()] {
        let env = Envelope {
            sender,
            ..p.envelope()
        };
        let bytes = encode(
            &env,
            &Body::GrantSegment {
                log: not_held,
                sealed,
            },
        );
        p.send(target, &bytes);
        let answer = p.receive(ANSWER_TIMEOUT).expect("an answer");
        match frame::decode(&answer).map(|f| f.body) {
            Ok(Body::Response(Response::Error {
                code: ErrorCode::UnknownLog,
                detail,
                ..
            })) => assert!(
                detail.contains(&format!("no remote log {not_held} of n0")),
                "{detail}"
            ),
            other => panic!("a request for log {not_held}: {other:?}"),
        }
    }
    // The cluster is idle: nothing else seals, and the segment named stays
    // granted to the log that holds it.
    let first = granted.first().expect("a granted segment");
    assert!(
        p.server(target).granted_segments().contains(first),
        "segment {first} sealed by a request naming another log"
    );
    assert_eq!(p.server(target).blog.sealed_segments(), sealed_before);
}

/// A server's remote log that asks for segments again and again without sealing
/// any is refused (`Busy`) once it holds the bound: it cannot take the pool
/// segment by segment. Sealing one lets it have another.
#[test]
fn a_remote_log_asking_for_segments_without_sealing_is_refused_past_the_bound() {
    let mut p = Probe::start(Strategy::Rwrite);
    let (sender, target) = (NodeId(0), NodeId(1));
    // A log the sender's workers hold there (their paths were set up).
    let log = p.server(target).remote_logs_of(sender)[0];
    p.send_from_server(sender, 0);
    let free_before = p.server(target).engine.free_segments();
    let mut granted = Vec::new();
    let mut refused = 0;
    for i in 0..3 * rowankv_server::worker::GRANTED_SEGMENTS_PER_LOG_MAX {
        let env = Envelope {
            sender,
            ..p.envelope()
        };
        let bytes = encode(&env, &Body::GrantSegment { log, sealed: None });
        p.send(target, &bytes);
        let answer = p
            .receive(ANSWER_TIMEOUT)
            .unwrap_or_else(|| panic!("grant request {i} not answered"));
        match frame::decode(&answer).map(|f| f.body) {
            Ok(Body::Response(Response::Segment { segment, .. })) => granted.push(segment),
            Ok(Body::Response(Response::Error {
                code: ErrorCode::Busy,
                ..
            })) => refused += 1,
            other => panic!("grant request {i}: {other:?}"),
        }
    }
    // The log already held its current segment and a standby.
    assert!(
        refused > 0,
        "every one of the requests was granted: {granted:?}"
    );
    assert!(
        free_before - p.server(target).engine.free_segments()
            <= rowankv_server::worker::GRANTED_SEGMENTS_PER_LOG_MAX,
        "{} segments taken",
        free_before - p.server(target).engine.free_segments()
    );
    // Sealing one of them makes room for one more.
    let env = Envelope {
        sender,
        ..p.envelope()
    };
    let seal = granted.last().copied().expect("some segment was granted");
    let bytes = encode(
        &env,
        &Body::GrantSegment {
            log,
            sealed: Some(seal),
        },
    );
    p.send(target, &bytes);
    let answer = p.receive(ANSWER_TIMEOUT).expect("an answer to the seal");
    match frame::decode(&answer).map(|f| f.body) {
        Ok(Body::Response(Response::Segment { .. })) => {}
        other => panic!("a request that seals a segment: {other:?}"),
    }
}
