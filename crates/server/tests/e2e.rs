//! End-to-end tests of a whole in-process RowanKV cluster — three servers of three
//! workers, four shards per server, every shard on all three servers — run for every
//! replication strategy (`rowan`, `rpc`, `rwrite`, `batch`, `share`):
//!
//! - clients on their own threads, each owning its keys, run random PUT/GET/DEL
//!   against a per-key model, and a pipelined client keeps 16 operations in flight;
//!   every answer (value *and* version) must be the model's;
//! - an acknowledged PUT or DEL is durable on every replica at the instant of its
//!   ACK: the image a power failure would leave (every unpersisted line dropped) of
//!   the primary's pool and of each backup's, taken right then, recovers it;
//! - once the cluster is quiescent and every backup has digested what it holds,
//!   every backup's index agrees with its primary's, after a workload that turns
//!   segments over (digest, commit and cleaning all run meanwhile);
//! - primaries disseminate each shard's CommitVer to the shard's backups.
//!
//! Each random choice comes from a seed, printed by every failure message. Thread
//! interleavings are not replayed by it; the per-key models do not depend on them.

#[allow(dead_code)] // each test file uses part of the helpers
mod common;
use common::recover_power_failure_image;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_client::{Client, ClientConfig, ClientError, Completed, Expect, Op, OpId, Output};
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_fabric::LoopbackNic;
use rowankv_rpc::directory::Directory;
use rowankv_server::{ServerSettings, Strategy};
use rowankv_types::{ShardId, Version};
use rowankv_wire::config::Config;
use rowankv_wire::frame::{ErrorCode, KV_BYTES_MAX};

const SERVERS: usize = 3;
const WORKERS: usize = 3;
const SHARDS_PER_SERVER: u16 = 4;
const POOL_BYTES: usize = 64 << 20;
const SEGMENT_BYTES: usize = 1 << 20;
/// Generous: two cores run the cluster and every client of up to two tests.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound on any phase that waits for a cluster to answer.
const PHASE_TIMEOUT: Duration = Duration::from_secs(60);

/// Random clients: threads, operations per thread, keys per thread, value bound.
const MODEL_CLIENTS: usize = 4;
const MODEL_OPS_PER_CLIENT: usize = 1500;
const MODEL_KEYS_PER_CLIENT: usize = 64;
const MODEL_VALUE_BYTES_MAX: usize = 300;
/// The pipelined client: operations, distinct keys, operations in flight.
const PIPELINED_OPS: usize = 2000;
const PIPELINED_KEYS: usize = 96;
const PIPELINED_INFLIGHT_MAX: usize = 16;

/// Sampled writes whose durability is checked on every replica's crash image: one
/// PUT per shard (each check opens three 64 MiB images), then DELs of some.
const DURABLE_DELS: usize = 4;

/// Replica agreement: threads, operations each, keys each, value bound (large
/// values turn 1 MiB segments over within the run; a PUT's key + value is at
/// most `KV_BYTES_MAX`, so the bound shrinks by the key's length).
const AGREE_CLIENTS: usize = 2;
const AGREE_OPS_PER_CLIENT: usize = 5000;
const AGREE_KEYS_PER_CLIENT: usize = 150;
const AGREE_VALUE_BYTES_MAX: usize = 4000;

/// CommitVer: PUTs per shard, the dissemination period and the longest wait
/// after (on a loaded machine a worker may not run for a while).
const COMMIT_PUTS_PER_SHARD: usize = 5;
const COMMIT_INTERVAL_NS: u64 = 1_000_000;
const COMMIT_WAIT_MAX: Duration = Duration::from_secs(10);

fn start(strategy: Strategy, commit_interval_ns: Option<u64>) -> Cluster {
    let defaults = ServerSettings::default();
    start_with(
        strategy,
        ServerSettings {
            commit_interval_ns: commit_interval_ns.unwrap_or(defaults.commit_interval_ns),
            ..defaults
        },
    )
}

/// [`start`] with `settings` (its workers and leases are the suite's).
fn start_with(strategy: Strategy, settings: ServerSettings) -> Cluster {
    Cluster::start(ClusterConfig {
        strategy,
        servers: SERVERS,
        shards_per_server: SHARDS_PER_SERVER,
        replication_factor: SERVERS as u8,
        pool_bytes: POOL_BYTES,
        segment_bytes: SEGMENT_BYTES,
        crash_sim: true,
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

/// What a client needs to connect from another thread.
struct ClientKit {
    nic: LoopbackNic,
    directory: Directory,
    source: Arc<dyn rowankv_wire::config::ConfigSource>,
    worker_hint: usize,
}

impl ClientKit {
    fn new(cluster: &mut Cluster, worker_hint: usize) -> ClientKit {
        ClientKit {
            nic: cluster.attach_client().expect("attaching a client"),
            directory: cluster.directory().clone(),
            source: cluster.config_source(),
            worker_hint,
        }
    }

    fn connect(self) -> Client<LoopbackNic> {
        Client::connect(
            self.nic,
            self.directory,
            self.source,
            ClientConfig {
                worker_hint: self.worker_hint,
                timeout: CLIENT_TIMEOUT,
                ..ClientConfig::default()
            },
        )
        .expect("connecting a client")
    }
}

fn client(cluster: &mut Cluster, worker_hint: usize) -> Client<LoopbackNic> {
    ClientKit::new(cluster, worker_hint).connect()
}

/// A key's latest acknowledged write.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Latest {
    Value { value: Vec<u8>, version: u64 },
    Deleted { version: u64 },
}

impl Latest {
    fn version(&self) -> u64 {
        match self {
            Latest::Value { version, .. } | Latest::Deleted { version } => *version,
        }
    }

    /// What a replica's engine holds for a key whose latest write is `latest`.
    fn in_engine(latest: Option<&Latest>) -> Option<(Vec<u8>, Version)> {
        match latest {
            Some(Latest::Value { value, version }) => Some((value.clone(), Version(*version))),
            Some(Latest::Deleted { .. }) | None => None,
        }
    }
}

/// Per key: its latest acknowledged write (absent: never written).
type Model = BTreeMap<Vec<u8>, Latest>;

fn random_value(rng: &mut ChaCha8Rng, bytes_max: usize) -> Vec<u8> {
    let len = rng.gen_range(0..=bytes_max);
    (0..len).map(|_| rng.gen()).collect()
}

/// A write's version must be newer than every earlier write of its key.
fn record_write(model: &mut Model, key: Vec<u8>, latest: Latest, ctx: &str) {
    if let Some(before) = model.get(&key) {
        assert!(
            latest.version() > before.version(),
            "{ctx}: version {} of {:?} is not newer than its previous write's {}",
            latest.version(),
            String::from_utf8_lossy(&key),
            before.version()
        );
    }
    model.insert(key, latest);
}

/// Check a GET's outcome against the model.
fn check_read(result: Result<Output, ClientError>, key: &[u8], model: &Model, ctx: &str) {
    let key_text = String::from_utf8_lossy(key);
    match (model.get(key), result) {
        (
            Some(Latest::Value { value, version }),
            Ok(Output::Value {
                value: v,
                version: n,
                expires_at_ms: None,
            }),
        ) => {
            assert!(
                v == *value && n == *version,
                "{ctx}: GET {key_text} returned {} B at version {n}, the model has {} B at \
                 version {version}",
                v.len(),
                value.len()
            );
        }
        (Some(Latest::Deleted { .. }) | None, Err(ClientError::NotFound)) => {}
        (expected, got) => panic!("{ctx}: GET {key_text}: expected {expected:?}, got {got:?}"),
    }
}

fn get_checked(c: &mut Client<LoopbackNic>, key: &[u8], model: &Model, ctx: &str) {
    let result = c.execute(Op::Get { key: key.to_vec() });
    check_read(result, key, model, ctx);
}

/// `ops` random operations on `keys` from one client, checked against its own
/// model: 45% PUT, 40% GET, 15% DEL. Returns the model.
fn random_client(
    mut c: Client<LoopbackNic>,
    keys: &[Vec<u8>],
    ops: usize,
    value_bytes_max: usize,
    seed: u64,
    who: &str,
) -> Model {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model = Model::new();
    for step in 0..ops {
        let key = keys[rng.gen_range(0..keys.len())].clone();
        let ctx = format!("{who} (seed {seed:#x}) step {step}");
        match rng.gen_range(0..100) {
            0..45 => {
                let bytes_max = value_bytes_max.min(KV_BYTES_MAX - key.len());
                let value = random_value(&mut rng, bytes_max);
                let version = c
                    .put(&key, &value)
                    .unwrap_or_else(|e| panic!("{ctx}: PUT: {e}"));
                record_write(&mut model, key, Latest::Value { value, version }, &ctx);
            }
            45..85 => get_checked(&mut c, &key, &model, &ctx),
            _ => {
                let version = c.delete(&key).unwrap_or_else(|e| panic!("{ctx}: DEL: {e}"));
                record_write(&mut model, key, Latest::Deleted { version }, &ctx);
            }
        }
    }
    model
}

/// Run `clients` random clients, each on its own thread with its own keys and
/// worker hint; returns the union of their models.
fn run_random_clients(
    cluster: &mut Cluster,
    clients: usize,
    ops: usize,
    keys_per_client: usize,
    value_bytes_max: usize,
    seed: u64,
) -> Model {
    let strategy = cluster.config().strategy;
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let kit = ClientKit::new(cluster, i);
            let keys: Vec<Vec<u8>> = (0..keys_per_client)
                .map(|k| format!("client{i}-key{k}").into_bytes())
                .collect();
            let seed = seed.wrapping_add(i as u64);
            thread::Builder::new()
                .name(format!("client-{i}"))
                .spawn(move || {
                    let who = format!("{strategy} client {i}");
                    random_client(kit.connect(), &keys, ops, value_bytes_max, seed, &who)
                })
                .expect("spawning a client thread")
        })
        .collect();
    let mut all = Model::new();
    for h in handles {
        all.extend(
            h.join()
                .expect("a client thread failed (see its panic above)"),
        );
    }
    all
}

/// One client with up to `PIPELINED_INFLIGHT_MAX` operations in flight, each on a
/// key no other in-flight operation touches, so the model is exact per key.
fn pipelined_client(c: &mut Client<LoopbackNic>, seed: u64, who: &str) -> Model {
    let keys: Vec<Vec<u8>> = (0..PIPELINED_KEYS)
        .map(|k| format!("pipelined-key{k}").into_bytes())
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model = Model::new();
    let mut inflight: HashMap<OpId, Op> = HashMap::new();
    let mut busy: HashSet<Vec<u8>> = HashSet::new();
    let mut submitted = 0;
    let mut completed = 0;
    let mut most_inflight = 0;
    let mut out: Vec<Completed> = Vec::new();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while submitted < PIPELINED_OPS || !inflight.is_empty() {
        while submitted < PIPELINED_OPS && inflight.len() < PIPELINED_INFLIGHT_MAX {
            let key = loop {
                let k = &keys[rng.gen_range(0..keys.len())];
                if !busy.contains(k) {
                    break k.clone();
                }
            };
            let op = match rng.gen_range(0..100) {
                0..45 => Op::Put {
                    expires_at_ms: None,
                    key: key.clone(),
                    value: random_value(&mut rng, MODEL_VALUE_BYTES_MAX),
                },
                45..85 => Op::Get { key: key.clone() },
                _ => Op::Del { key: key.clone() },
            };
            let id = c
                .submit(op.clone())
                .unwrap_or_else(|e| panic!("{who} (seed {seed:#x}): submit #{submitted}: {e}"));
            inflight.insert(id, op);
            busy.insert(key);
            submitted += 1;
        }
        most_inflight = most_inflight.max(c.inflight());
        out.clear();
        if c.poll(&mut out) == 0 {
            assert!(
                Instant::now() < deadline,
                "{who} (seed {seed:#x}): {} operations still in flight after {PHASE_TIMEOUT:?}",
                inflight.len()
            );
            thread::yield_now();
            continue;
        }
        for done in out.drain(..) {
            let op = inflight
                .remove(&done.id)
                .unwrap_or_else(|| panic!("{who}: completion of unknown {:?}", done.id));
            busy.remove(op.key());
            let ctx = format!("{who} (seed {seed:#x}) completion #{completed}");
            completed += 1;
            match (op, done.result) {
                (Op::Put { key, value, .. }, Ok(Output::Written { version })) => {
                    record_write(&mut model, key, Latest::Value { value, version }, &ctx)
                }
                (Op::Del { key }, Ok(Output::Written { version })) => {
                    record_write(&mut model, key, Latest::Deleted { version }, &ctx)
                }
                (Op::Get { key }, result) => check_read(result, &key, &model, &ctx),
                (op, result) => panic!("{ctx}: {op:?} ended {result:?}"),
            }
        }
    }
    assert_eq!(
        completed, PIPELINED_OPS,
        "{who}: every operation completes once"
    );
    assert!(
        most_inflight > 1 && most_inflight <= PIPELINED_INFLIGHT_MAX,
        "{who}: the client had {most_inflight} operations in flight at most"
    );
    model
}

/// Every key of `model`, read by a client that did not write it.
fn check_all_keys(c: &mut Client<LoopbackNic>, model: &Model, who: &str) {
    for key in model.keys() {
        get_checked(c, key, model, who);
    }
}

/// After a quiescent digest, every replica of each key's shard holds what the
/// primary holds, and that is the model's latest write.
fn check_replicas_agree(cluster: &Cluster, model: &Model, who: &str) {
    let segments = cluster
        .digest_everything()
        .unwrap_or_else(|e| panic!("{who}: {e}"));
    assert!(segments > 0, "{who}: the backups digested nothing");
    let config = cluster.cm().current();
    let servers = cluster.servers();
    let mut disagreements = Vec::new();
    for (key, latest) in model {
        let s = config.shard_for_key(key);
        let primary = servers[s.primary.0 as usize]
            .engine
            .get(s.shard, key)
            .unwrap_or_else(|e| panic!("{who}: primary {} read: {e}", s.primary));
        let expected = Latest::in_engine(Some(latest));
        assert_eq!(
            primary.as_ref().map(|(v, n)| (v.len(), *n)),
            expected.as_ref().map(|(v, n)| (v.len(), *n)),
            "{who}: primary {} of {} holds the wrong write of {:?}",
            s.primary,
            s.shard,
            String::from_utf8_lossy(key)
        );
        assert_eq!(primary, expected, "{who}: primary value bytes differ");
        for &b in &s.backups {
            let backup = servers[b.0 as usize]
                .engine
                .get(s.shard, key)
                .unwrap_or_else(|e| panic!("{who}: backup {b} read: {e}"));
            if backup != primary {
                disagreements.push(format!(
                    "{:?} in {}: primary {} has {:?}, backup {b} has {:?}",
                    String::from_utf8_lossy(key),
                    s.shard,
                    s.primary,
                    primary.as_ref().map(|(v, n)| (v.len(), n.0)),
                    backup.as_ref().map(|(v, n)| (v.len(), n.0)),
                ));
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "{who}: {} of {} keys disagree between primary and backup (first 10):\n{}",
        disagreements.len(),
        model.len(),
        disagreements[..disagreements.len().min(10)].join("\n")
    );
}

fn clients_and_a_pipelined_client_agree_with_a_model(strategy: Strategy, seed: u64) {
    let mut cluster = start(strategy, None);
    let mut model = run_random_clients(
        &mut cluster,
        MODEL_CLIENTS,
        MODEL_OPS_PER_CLIENT,
        MODEL_KEYS_PER_CLIENT,
        MODEL_VALUE_BYTES_MAX,
        seed,
    );
    assert!(
        model.values().any(|l| matches!(l, Latest::Deleted { .. }))
            && model.values().any(|l| matches!(l, Latest::Value { .. })),
        "{strategy}: the workload should leave both values and tombstones"
    );
    let mut fresh = client(&mut cluster, 1);
    check_all_keys(&mut fresh, &model, &format!("{strategy} fresh client"));

    let who = format!("{strategy} pipelined client");
    let pipelined = pipelined_client(&mut fresh, seed ^ 0x5049_5045, &who);
    let mut reader = client(&mut cluster, 2);
    check_all_keys(&mut reader, &pipelined, &format!("{strategy} reader"));

    // Everything acknowledged; nothing in flight.
    model.extend(pipelined);
    check_replicas_agree(&cluster, &model, &format!("{strategy} (seed {seed:#x})"));
    cluster.shutdown();
}

/// Keys spread over every shard: about `count / shards` per shard.
fn keys_over_shards(config: &Config, prefix: &str, count: usize) -> Vec<Vec<u8>> {
    let shards = config.shard_count() as usize;
    let per_shard = count.div_ceil(shards);
    let mut taken = vec![0usize; shards];
    let mut keys = Vec::new();
    let mut i = 0u64;
    while keys.len() < count {
        let key = format!("{prefix}{i}").into_bytes();
        i += 1;
        let s = config.shard_for_key(&key).shard.0 as usize;
        if taken[s] < per_shard {
            taken[s] += 1;
            keys.push(key);
        }
    }
    keys
}

/// Assert that every replica of `key`'s shard, on a power failure right now,
/// recovers `expected`.
fn check_durable_everywhere(
    cluster: &Cluster,
    key: &[u8],
    expected: Option<(Vec<u8>, Version)>,
    ctx: &str,
) {
    let config = cluster.cm().current();
    let s = config.shard_for_key(key);
    let replicas = std::iter::once(s.primary).chain(s.backups.iter().copied());
    for node in replicas {
        let role = if node == s.primary {
            "primary"
        } else {
            "backup"
        };
        let engine = recover_power_failure_image(&cluster.servers()[node.0 as usize]);
        let got = engine
            .get(s.shard, key)
            .unwrap_or_else(|e| panic!("{ctx}: reading the recovered {role} {node}: {e}"));
        assert_eq!(
            got.as_ref().map(|(v, n)| (v.len(), *n)),
            expected.as_ref().map(|(v, n)| (v.len(), *n)),
            "{ctx}: after a power failure of {role} {node} at the ACK, {} of {:?} does not \
             hold the acknowledged write (length, version)",
            s.shard,
            String::from_utf8_lossy(key)
        );
        assert_eq!(got, expected, "{ctx}: {role} {node}: value bytes differ");
    }
}

fn an_acknowledged_write_survives_a_power_failure_of_any_replica(strategy: Strategy, seed: u64) {
    let mut cluster = start(strategy, None);
    // Other writes keep flowing meanwhile, so that the images hold unpersisted lines.
    let stop = Arc::new(AtomicBool::new(false));
    let background = {
        let kit = ClientKit::new(&mut cluster, 1);
        let stop = stop.clone();
        thread::spawn(move || {
            let mut c = kit.connect();
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xb6);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("background-{}", n % 200);
                let value = random_value(&mut rng, 300);
                c.put(key.as_bytes(), &value)
                    .unwrap_or_else(|e| panic!("{strategy} background PUT {n}: {e}"));
                n += 1;
            }
            n
        })
    };
    let mut c = client(&mut cluster, 0);
    let config = cluster.cm().current();
    let keys = keys_over_shards(&config, "durable-", config.shard_count() as usize);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (i, key) in keys.iter().enumerate() {
        // Mostly small values, every fourth near the largest a PUT may carry.
        let value = if i % 4 == 3 {
            let len = rng.gen_range(3000..=KV_BYTES_MAX - key.len());
            (0..len).map(|_| rng.gen()).collect()
        } else {
            random_value(&mut rng, MODEL_VALUE_BYTES_MAX)
        };
        let version = c
            .put(key, &value)
            .unwrap_or_else(|e| panic!("{strategy} PUT #{i}: {e}"));
        let ctx = format!("{strategy} (seed {seed:#x}) PUT #{i} v{version}");
        check_durable_everywhere(&cluster, key, Some((value, Version(version))), &ctx);
    }
    // A DEL's tombstone must be as durable: otherwise the old value comes back.
    for (i, key) in keys.iter().take(DURABLE_DELS).enumerate() {
        let version = c
            .delete(key)
            .unwrap_or_else(|e| panic!("{strategy} DEL #{i}: {e}"));
        let ctx = format!("{strategy} (seed {seed:#x}) DEL #{i} v{version}");
        check_durable_everywhere(&cluster, key, None, &ctx);
    }
    stop.store(true, Ordering::Relaxed);
    let background_puts = background.join().expect("the background client failed");
    assert!(background_puts > 0, "{strategy}: no background load ran");
    cluster.shutdown();
}

/// `drpc`: a write is acknowledged once its entry is durable in each backup's
/// redo ring, before any CPU of the backup has touched it. With every server's
/// redo role held back, so that the rings alone hold the entries, each
/// acknowledged write must still be on every replica after a power failure at
/// its ACK: the WFlush made the entry durable, and a restarted backup's
/// recovery re-executes it into its b-log (`recover_power_failure_image` does
/// what a restart does).
#[test]
fn drpc_a_write_acknowledged_by_the_redo_rings_alone_survives_a_power_failure() {
    let mut cluster = start(Strategy::Drpc, None);
    for s in cluster.servers() {
        s.buggify.force("redo.skip-step", u32::MAX / 2);
    }
    let mut c = client(&mut cluster, 0);
    let config = cluster.cm().current();
    let keys = keys_over_shards(&config, "ring-", config.shard_count() as usize);
    for (i, key) in keys.iter().enumerate() {
        let value = format!("acknowledged by the rings {i}").into_bytes();
        let version = c
            .put(key, &value)
            .unwrap_or_else(|e| panic!("drpc PUT #{i}: {e}"));
        let ctx = format!("drpc, redo roles held back, PUT #{i} v{version}");
        check_durable_everywhere(&cluster, key, Some((value, Version(version))), &ctx);
    }
    let executed: u64 = cluster
        .servers()
        .iter()
        .map(|s| s.redo.get().expect("drpc's rings").lock().counts().0)
        .sum();
    assert_eq!(
        executed, 0,
        "the redo roles were held back: the rings alone held the entries"
    );
    cluster.shutdown();
}

/// `drpc`: a backup whose b-log has no room for what its redo rings
/// acknowledged defers it — never waits inside a request, never panics — and,
/// the stall lasting past `redo_stall_limit`, stops itself (a fail-stop); its
/// rings keep every acknowledged entry, which its restart re-executes. (The
/// b-log's lack of room is the `redo.no-room` fault site, forced on for good.)
#[test]
fn drpc_a_backup_without_room_stops_itself_and_keeps_what_its_rings_acknowledged() {
    let mut cluster = start_with(
        Strategy::Drpc,
        ServerSettings {
            // A stall limit of 2 × 300 ms rather than the leases' minutes.
            replicate_timeout_ns: Some(300_000_000),
            ..ServerSettings::default()
        },
    );
    let stuck = cluster.servers()[2].clone();
    stuck.buggify.force("redo.no-room", u32::MAX / 2);
    let mut c = client(&mut cluster, 0);
    let config = cluster.cm().current();
    let keys: Vec<Vec<u8>> =
        keys_over_shards(&config, "no-room-", 4 * config.shard_count() as usize)
            .into_iter()
            .filter(|k| config.shard_for_key(k).primary != stuck.node)
            .take(6)
            .collect();
    assert_eq!(keys.len(), 6);
    let mut written = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let value = format!("waits in the rings {i}").into_bytes();
        let version = c
            .put(key, &value)
            .unwrap_or_else(|e| panic!("PUT #{i}: {e}"));
        written.push((key.clone(), value, Version(version)));
    }
    let deadline = Instant::now() + PHASE_TIMEOUT;
    while !stuck.stopped() {
        assert!(
            Instant::now() < deadline,
            "{}: its b-log had no room for {PHASE_TIMEOUT:?} and it did not stop",
            stuck.node
        );
        thread::sleep(Duration::from_millis(10));
    }
    let why = stuck.fail_stopped().expect("stopped by itself");
    assert!(why.contains("no room"), "{why}");
    {
        let rings = stuck.redo.get().expect("drpc's rings").lock();
        assert_eq!(rings.counts().0, 0, "nothing was appended to the b-log");
        assert!(rings.deferred() > 0, "requests were deferred");
    }
    // Every acknowledged write is in the stopped backup's rings: its restart
    // (the recovery of its pool) re-executes them into its b-log.
    for (key, value, version) in written {
        check_durable_everywhere(
            &cluster,
            &key,
            Some((value, version)),
            "drpc, a backup stopped for want of room",
        );
    }
    cluster.shutdown();
}

fn backups_index_what_primaries_index(strategy: Strategy, seed: u64) {
    let mut cluster = start(strategy, None);
    let model = run_random_clients(
        &mut cluster,
        AGREE_CLIENTS,
        AGREE_OPS_PER_CLIENT,
        AGREE_KEYS_PER_CLIENT,
        AGREE_VALUE_BYTES_MAX,
        seed,
    );
    // The workload filled segments, so the backups' own digest roles index some
    // of it on their own (on a loaded machine, perhaps only after the workload);
    // the forced digest below only completes their work.
    let config = cluster.cm().current();
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for server in cluster.servers() {
        let indexed = || -> usize {
            config
                .backup_shards(server.node)
                .map(|s| {
                    server
                        .engine
                        .indexed(s.shard)
                        .expect("a shard of the engine")
                })
                .sum()
        };
        while indexed() == 0 {
            assert!(
                Instant::now() < deadline,
                "{strategy}: backup {} digested nothing within {PHASE_TIMEOUT:?}",
                server.node
            );
            thread::sleep(Duration::from_millis(5));
        }
    }
    check_replicas_agree(&cluster, &model, &format!("{strategy} (seed {seed:#x})"));
    let mut c = client(&mut cluster, 2);
    check_all_keys(&mut c, &model, &format!("{strategy} after digest"));
    cluster.shutdown();
}

/// The last acknowledged PUT of every shard, after a few PUTs to each.
fn put_to_every_shard(cluster: &mut Cluster, seed: u64) -> BTreeMap<ShardId, u64> {
    let config = cluster.cm().current();
    let shards = config.shard_count() as usize;
    let keys = keys_over_shards(&config, "commit-", shards * COMMIT_PUTS_PER_SHARD);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut c = client(cluster, 0);
    let mut last = BTreeMap::new();
    for key in &keys {
        let value = random_value(&mut rng, MODEL_VALUE_BYTES_MAX);
        let version = c.put(key, &value).expect("PUT");
        let shard = config.shard_for_key(key).shard;
        let before = last.insert(shard, version);
        assert!(
            before.is_none_or(|b| b < version),
            "versions of {shard} grow"
        );
    }
    last
}

/// Shards whose backups' CommitVer is below the shard's last acknowledged PUT:
/// (shard, backup, backup's CommitVer, last PUT's version).
fn commit_version_lag(cluster: &Cluster, last: &BTreeMap<ShardId, u64>) -> Vec<String> {
    let config = cluster.cm().current();
    let mut lagging = Vec::new();
    for (&shard, &version) in last {
        let s = config.shard(shard).expect("a shard of the configuration");
        for &b in &s.backups {
            let seen = cluster.servers()[b.0 as usize].blog.commit_version(shard);
            if seen < version {
                lagging.push(format!(
                    "{shard}: backup {b} has CommitVer {seen}, last acknowledged PUT v{version}"
                ));
            }
        }
    }
    lagging
}

/// The CommitVer records are in every backup's log: digesting what the backups
/// hold raises their CommitVer to at least each shard's last acknowledged PUT.
fn commit_versions_are_in_the_backups_logs(strategy: Strategy, seed: u64) {
    let mut cluster = start(strategy, Some(COMMIT_INTERVAL_NS));
    let last = put_to_every_shard(&mut cluster, seed);
    // Worker 0 of each primary sends the records on its own period: digest
    // (idempotent) until the backups caught up, or the wait is over.
    let deadline = Instant::now() + COMMIT_WAIT_MAX;
    let lagging = loop {
        cluster.digest_everything().expect("digest");
        let lagging = commit_version_lag(&cluster, &last);
        if lagging.is_empty() || Instant::now() >= deadline {
            break lagging;
        }
        thread::sleep(Duration::from_millis(5));
    };
    cluster.shutdown();
    assert!(
        lagging.is_empty(),
        "{strategy}: after a full digest, {} (shard, backup) pairs lag (first 5):\n{}",
        lagging.len(),
        lagging[..lagging.len().min(5)].join("\n")
    );
}

fn condition_failed(r: Result<u64, ClientError>) -> bool {
    matches!(
        r,
        Err(ClientError::Server {
            code: ErrorCode::ConditionFailed,
            ..
        })
    )
}

/// Conditional writes (`PutIf`, `DelIf`): each executes only if its condition
/// holds on the key's live value, and concurrent read-modify-write loops over
/// them lose no update (the read-modify-write commands of the RESP front end).
fn conditional_writes_are_atomic_per_key(strategy: Strategy) {
    let mut cluster = start(strategy, None);
    let mut c = client(&mut cluster, 0);
    let k = b"cond-key".as_slice();
    let v1 = c.put_if(k, b"a", Expect::Absent).expect("absent");
    assert!(
        condition_failed(c.put_if(k, b"b", Expect::Absent)),
        "present now"
    );
    let v2 = c.put_if(k, b"b", Expect::Version(v1)).expect("at v1");
    assert!(v2 > v1);
    assert!(
        condition_failed(c.put_if(k, b"c", Expect::Version(v1))),
        "stale"
    );
    assert!(
        condition_failed(c.delete_if(k, Expect::Version(v1))),
        "stale"
    );
    assert_eq!(c.get_versioned(k).unwrap(), Some((b"b".to_vec(), v2)));
    c.delete_if(k, Expect::Version(v2)).expect("at v2");
    assert_eq!(c.get_versioned(k).unwrap(), None);
    assert!(
        condition_failed(c.put_if(k, b"d", Expect::Version(v2))),
        "deleted"
    );
    c.put_if(k, b"d", Expect::Absent)
        .expect("absent after the delete");

    // Counters incremented by read + conditional write, from several threads.
    const THREADS: usize = 3;
    const INCREMENTS: u64 = 60;
    let counters: Vec<Vec<u8>> = (0..2)
        .map(|i| format!("counter-{i}").into_bytes())
        .collect();
    let mut clients: Vec<_> = (0..THREADS).map(|t| client(&mut cluster, t)).collect();
    let handles: Vec<_> = clients
        .drain(..)
        .map(|mut c| {
            let counters = counters.clone();
            thread::spawn(move || {
                let mut conflicts = 0u64;
                for i in 0..INCREMENTS {
                    let key = &counters[i as usize % counters.len()];
                    loop {
                        let (n, expect) = match c.get_versioned(key).expect("read") {
                            Some((v, version)) => (
                                String::from_utf8(v).unwrap().parse::<u64>().unwrap(),
                                Expect::Version(version),
                            ),
                            None => (0, Expect::Absent),
                        };
                        match c.put_if(key, (n + 1).to_string().as_bytes(), expect) {
                            Ok(_) => break,
                            r if condition_failed(r.clone()) => conflicts += 1,
                            Err(e) => panic!("increment: {e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let conflicts: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let total: u64 = counters
        .iter()
        .map(|k| {
            let v = c.get(k).unwrap();
            String::from_utf8(v).unwrap().parse::<u64>().unwrap()
        })
        .sum();
    assert_eq!(
        total,
        THREADS as u64 * INCREMENTS,
        "{strategy}: increments lost ({conflicts} conflicts retried)"
    );
}

macro_rules! for_strategy {
    ($module:ident, $strategy:expr, $seed:expr $(, $extra:item)* $(,)?) => {
        mod $module {
            use super::*;

            #[test]
            fn clients_and_a_pipelined_client_agree_with_a_model() {
                super::clients_and_a_pipelined_client_agree_with_a_model($strategy, $seed);
            }

            #[test]
            fn an_acknowledged_write_survives_a_power_failure_of_any_replica() {
                super::an_acknowledged_write_survives_a_power_failure_of_any_replica(
                    $strategy, $seed,
                );
            }

            #[test]
            fn backups_index_what_primaries_index() {
                super::backups_index_what_primaries_index($strategy, $seed);
            }

            #[test]
            fn commit_versions_are_in_the_backups_logs() {
                super::commit_versions_are_in_the_backups_logs($strategy, $seed);
            }

            #[test]
            fn conditional_writes_are_atomic_per_key() {
                super::conditional_writes_are_atomic_per_key($strategy);
            }

            $($extra)*
        }
    };
}

for_strategy!(rowan, Strategy::Rowan, 0x0e2e_0001);
for_strategy!(rpc, Strategy::Rpc, 0x0e2e_0002);
for_strategy!(rwrite, Strategy::Rwrite, 0x0e2e_0003);
for_strategy!(batch, Strategy::Batch, 0x0e2e_0004);
for_strategy!(share, Strategy::Share, 0x0e2e_0005);
for_strategy!(drpc, Strategy::Drpc, 0x0e2e_0006);

/// SCAN (`Client::scan`, answered by each shard's primary): every live key once,
/// deleted ones not at all, in pages that end at whole index buckets; a page
/// never passes the frame, whatever `count` asks.
#[test]
fn scan_lists_every_live_key_once() {
    let mut cluster = start(Strategy::Rowan, None);
    let mut c = client(&mut cluster, 0);
    let mut live = HashSet::new();
    for i in 0..600u32 {
        let key = format!("scan-{i}").into_bytes();
        c.put(&key, b"v").unwrap();
        if i % 7 == 3 {
            c.delete(&key).unwrap();
        } else {
            live.insert(key);
        }
    }
    // A long key fills pages faster.
    let long = vec![b'L'; 1000];
    c.put(&long, b"v").unwrap();
    live.insert(long);
    let shards: Vec<ShardId> = c.cluster_config().shards.iter().map(|s| s.shard).collect();
    for count in [1u32, 7, 100_000] {
        let mut seen = Vec::new();
        let mut pages = 0;
        for &shard in &shards {
            let mut cursor = 0;
            loop {
                let (next, mut keys) = c.scan(shard, cursor, count).unwrap();
                pages += 1;
                seen.append(&mut keys);
                if next == 0 {
                    break;
                }
                assert!(next > cursor, "the cursor moves on");
                cursor = next;
            }
        }
        let distinct: HashSet<Vec<u8>> = seen.iter().cloned().collect();
        assert_eq!(
            seen.len(),
            distinct.len(),
            "count {count}: a key listed twice"
        );
        assert_eq!(distinct, live, "count {count}");
        eprintln!("count {count}: {} keys in {pages} pages", seen.len());
    }
    // A shard the configuration does not have.
    assert!(c.scan(ShardId(9999), 0, 10).is_err());
}
