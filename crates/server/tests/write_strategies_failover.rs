//! The one-sided WRITE strategies (`rwrite`, `batch`, `share`) under link
//! faults and a primary's removal, on the threaded in-process cluster. Each test
//! runs once per strategy.
//!
//! - A WRITE that failed on a cut link puts the sender's queue pair in the error
//!   state; the sender resets it, so the write is replicated again once the link
//!   heals (and later writes go through) instead of every later WRITE being
//!   flushed.
//! - A backup that adopted a configuration without a primary destroyed its end
//!   of the primary's WRITE queue pairs: what the removed primary still writes
//!   never lands there (the fence), and the segments it had granted to the
//!   removed primary are sealed, not held for good.
//! - A seal a sender sends again (it lost the answer to the first) is ignored,
//!   and so is a seal of a segment granted to another log: neither fails the
//!   request, and neither seals a segment twice or seals another log's.
//!
//! (The grant exchange — requests refused, lost, or never answered — is tested
//! against a hand-played backup in `replication::tests`.)
//!
//! Nothing here waits on a timer to decide an outcome: faults are set when the
//! servers' counters show the step before them happened, and every wait is
//! bounded only to fail a test that hangs.

mod common;
use common::recover_power_failure_image;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rowankv_client::{Client, ClientConfig, ClientError, Completed, Op, Output};
use rowankv_cm::plan_failover;
use rowankv_deploy::{Cluster, ClusterConfig};
use rowankv_fabric::{FaultInjector, LoopbackNic};
use rowankv_rpc::endpoint::{Endpoint, EndpointConfig, Event, PeerId};
use rowankv_server::{ServerSettings, ServerShared, Strategy};
use rowankv_types::{NodeId, ShardId};
use rowankv_wire::config::Config;
use rowankv_wire::frame::{self, Body, Envelope, Response};

const STRATEGIES: [Strategy; 3] = [Strategy::Rwrite, Strategy::Batch, Strategy::Share];
/// Bound on waiting for anything that must happen.
const WAIT_MAX: Duration = Duration::from_secs(30);
/// The primary of the shard written, and its two backups.
const P: NodeId = NodeId(0);
const B1: NodeId = NodeId(1);
const B2: NodeId = NodeId(2);

fn settings() -> ServerSettings {
    ServerSettings {
        workers: 1,
        failover: common::steady_leases(),
        // Steady leases make the default (twice the lease) a minute.
        replicate_timeout_ns: Some(200_000_000),
        ..ServerSettings::default()
    }
}

fn start(strategy: Strategy, settings: ServerSettings) -> Cluster {
    Cluster::start(ClusterConfig {
        strategy,
        servers: 3,
        shards_per_server: 2,
        replication_factor: 3,
        pool_bytes: 32 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 256,
        crash_sim: true,
        settings,
        ..ClusterConfig::default()
    })
    .expect("a cluster")
}

/// A client whose operations give up after `timeout`.
fn client(cluster: &mut Cluster, timeout: Duration) -> Client<LoopbackNic> {
    common::client_of(
        cluster,
        ClientConfig {
            timeout,
            ..ClientConfig::default()
        },
    )
    .expect("a client")
}

/// A shard `P` leads, and keys of it.
fn keys_of_p(config: &Config) -> (ShardId, impl Iterator<Item = Vec<u8>> + '_) {
    let shard = config
        .primary_shards(P)
        .next()
        .expect("a shard of the primary")
        .shard;
    let keys = (0u32..)
        .map(|i| format!("key-{i}").into_bytes())
        .filter(move |k| config.shard_for_key(k).shard == shard);
    (shard, keys)
}

fn server(cluster: &Cluster, n: NodeId) -> &Arc<ServerShared<LoopbackNic>> {
    &cluster.servers()[n.0 as usize]
}

fn replication_failures(cluster: &Cluster, n: NodeId) -> u64 {
    server(cluster, n)
        .stats
        .replication_failures
        .load(Ordering::Relaxed)
}

/// Poll `c` until operation `id` completes (doing `meanwhile` between polls).
fn completion(
    c: &mut Client<LoopbackNic>,
    id: rowankv_client::OpId,
    mut meanwhile: impl FnMut(),
) -> Completed {
    let deadline = Instant::now() + WAIT_MAX;
    let mut out = Vec::new();
    loop {
        c.poll(&mut out);
        if let Some(i) = out.iter().position(|d| d.id == id) {
            return out.swap_remove(i);
        }
        meanwhile();
        assert!(
            Instant::now() < deadline,
            "operation {id:?} never completed"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// What `n` holds durably for `key` (its pool as a power failure would leave
/// it, recovered: every landed entry indexed).
fn held(cluster: &Cluster, n: NodeId, shard: ShardId, key: &[u8]) -> Option<String> {
    recover_power_failure_image(server(cluster, n))
        .get(shard, key)
        .expect("a shard of the engine")
        .map(|(v, _)| String::from_utf8_lossy(&v).into_owned())
}

fn put(key: &[u8], value: &str) -> Op {
    Op::Put {
        expires_at_ms: None,
        key: key.to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

#[test]
fn a_remote_log_write_that_failed_on_a_cut_link_is_replicated_again_once_it_heals() {
    for strategy in STRATEGIES {
        let mut cluster = start(strategy, settings());
        let mut c = client(&mut cluster, Duration::from_secs(20));
        let config = cluster.cm().current();
        let (shard, mut keys) = keys_of_p(&config);
        let (k1, k2) = (keys.next().unwrap(), keys.next().unwrap());
        // The remote logs have their segments.
        c.put(&k1, b"before the cut")
            .expect("a PUT on a healthy cluster");

        let failures = replication_failures(&cluster, P);
        cluster.fabric().cut_link(P, B1);
        let id = c.submit(put(&k1, "during the cut")).unwrap();
        let mut healed = false;
        let done = completion(&mut c, id, || {
            // Heal once the WRITE to B1 has failed (and left its queue pair in
            // the error state).
            if !healed && replication_failures(&cluster, P) > failures {
                cluster.fabric().heal_link(P, B1);
                healed = true;
            }
        });
        assert!(
            healed,
            "{strategy}: the write completed with the link cut: {done:?}"
        );
        assert!(
            matches!(done.result, Ok(Output::Written { .. })),
            "{strategy}: the write was not replicated again after the link healed: {:?}",
            done.result
        );
        c.put(&k2, b"after the heal")
            .unwrap_or_else(|e| panic!("{strategy}: a later write failed: {e}"));
        for n in [P, B1, B2] {
            assert_eq!(
                held(&cluster, n, shard, &k1).as_deref(),
                Some("during the cut"),
                "{strategy}: {n}"
            );
            assert_eq!(
                held(&cluster, n, shard, &k2).as_deref(),
                Some("after the heal"),
                "{strategy}: {n}"
            );
        }
        cluster.shutdown();
    }
}

/// The fence: a backup that adopted a configuration without the primary has
/// destroyed its end of the primary's WRITE queue pairs, so a write the removed
/// primary still sends (it has not learnt of its removal) never lands there,
/// while a backup that has not adopted it yet still takes it.
#[test]
fn a_removed_primarys_remote_log_write_does_not_land_at_a_backup_that_adopted_its_removal() {
    for strategy in STRATEGIES {
        let mut cluster = start(strategy, settings());
        let mut c = client(&mut cluster, Duration::from_secs(2));
        let config = cluster.cm().current();
        let (shard, mut keys) = keys_of_p(&config);
        let (before, after) = (keys.next().unwrap(), keys.next().unwrap());
        // P's remote logs at B1 have segments: the next write goes by WRITE,
        // with no grant request B1 could refuse for its term.
        c.put(&before, b"before the removal")
            .expect("the PUT before");
        for b in [B1, B2] {
            assert_eq!(
                held(&cluster, b, shard, &before).as_deref(),
                Some("before the removal"),
                "{strategy}: backup {b} before the removal"
            );
        }

        // B1 adopts the configuration that removes P; P and B2 have not heard
        // of it.
        let next = plan_failover(&config, &[P]).expect("a failover plan");
        assert!(server(&cluster, B1).adopt(Arc::new(next)), "B1 adopts");
        let outcome = c.put(&after, b"after the removal");
        assert!(
            outcome.as_ref().is_err_and(ClientError::is_unknown),
            "{strategy}: a write B1 cannot hold was not left of unknown outcome: {outcome:?}"
        );
        assert_eq!(
            held(&cluster, B1, shard, &after),
            None,
            "{strategy}: the removed primary's write landed at B1"
        );
        assert_eq!(
            held(&cluster, B2, shard, &after).as_deref(),
            Some("after the removal"),
            "{strategy}: B2 still has P in its configuration and takes its writes"
        );
        cluster.shutdown();
    }
}

#[test]
fn a_backup_seals_the_segments_it_granted_to_a_server_it_removed() {
    for strategy in STRATEGIES {
        let mut s = settings();
        // Sealed segments stay in their grace period for the test's length.
        s.blog.grace_ns = 3_600_000_000_000;
        let mut cluster = start(strategy, s);
        let mut c = client(&mut cluster, Duration::from_secs(2));
        let config = cluster.cm().current();
        let (_, mut keys) = keys_of_p(&config);
        c.put(&keys.next().unwrap(), b"x").expect("a PUT");
        let b1 = server(&cluster, B1);
        let granted: BTreeSet<u32> = b1.granted_segments().into_iter().collect();
        assert!(
            !granted.is_empty(),
            "{strategy}: P was granted segments at B1"
        );

        let next = plan_failover(&config, &[P]).expect("a failover plan");
        assert!(b1.adopt(Arc::new(next)), "B1 adopts");
        // Only B2 may be granted segments at B1 now: P is no member and its
        // term is stale.
        let still: BTreeSet<u32> = b1.granted_segments().into_iter().collect();
        let taken_back: Vec<u32> = granted.difference(&still).copied().collect();
        assert!(
            !taken_back.is_empty(),
            "{strategy}: B1 still holds every segment it granted: {granted:?}"
        );
        let sealed: BTreeSet<u32> = b1.blog.sealed_segments().iter().map(|s| s.0).collect();
        for seg in taken_back {
            assert!(
                sealed.contains(&seg),
                "{strategy}: segment {seg}, granted to P, is neither granted nor sealed ({sealed:?})"
            );
        }
        cluster.shutdown();
    }
}

/// A server's machine asking another server's worker 0 for segments directly.
struct Asker {
    ep: Endpoint<LoopbackNic>,
    node: NodeId,
    peer: PeerId,
    /// One of the remote logs the asking server holds there.
    log: u32,
    next_request: u64,
}

impl Asker {
    fn new(cluster: &Cluster, from: NodeId, to: NodeId) -> Asker {
        let nic = cluster.server_nic(from.0 as usize);
        let mut ep = Endpoint::new(nic, EndpointConfig::default()).expect("an endpoint");
        let peer = cluster
            .directory()
            .connect(&mut ep, to, 0, WAIT_MAX)
            .expect("connected to the worker");
        let log = server(cluster, to).remote_logs_of(from)[0];
        Asker {
            ep,
            node: from,
            peer,
            log,
            next_request: 1,
        }
    }

    /// Ask for a segment for its log, sealing `sealed`: the segment granted,
    /// or the refusal.
    fn grant(&mut self, config: &Config, sealed: Option<u32>) -> Result<u32, String> {
        let env = Envelope {
            cluster_id: config.cluster_id,
            term: config.term,
            request_id: self.next_request,
            sender: self.node,
        };
        self.next_request += 1;
        self.ep
            .request(
                self.peer,
                &env,
                &Body::GrantSegment {
                    log: self.log,
                    sealed,
                },
            )
            .expect("sent");
        let deadline = Instant::now() + WAIT_MAX;
        let (mut events, mut data) = (Vec::new(), Vec::new());
        loop {
            self.ep.poll(&mut events, &mut data).expect("polling");
            for ev in &events {
                let Event::Message { start, len, .. } = *ev else {
                    continue;
                };
                let f = frame::decode(&data[start..start + len]).expect("an answer decodes");
                if f.header.request_id != env.request_id {
                    continue;
                }
                return match f.body {
                    Body::Response(Response::Segment { segment, .. }) => Ok(segment),
                    other => Err(format!("{other:?}")),
                };
            }
            assert!(Instant::now() < deadline, "no answer to a grant request");
            thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn a_seal_sent_again_or_by_another_log_is_ignored_and_the_request_granted() {
    let mut s = settings();
    s.blog.grace_ns = 3_600_000_000_000;
    let cluster = start(Strategy::Rwrite, s);
    let config = cluster.cm().current();
    let b1 = server(&cluster, B1);
    let mut from_p = Asker::new(&cluster, P, B1);
    let mut from_b2 = Asker::new(&cluster, B2, B1);
    let sealed_count = |seg: u32| {
        b1.blog
            .sealed_segments()
            .iter()
            .filter(|s| s.0 == seg)
            .count()
    };

    let seg = from_p.grant(&config, None).expect("a segment for P");
    // Another server's log cannot seal it; its request is still granted.
    from_b2
        .grant(&config, Some(seg))
        .expect("B2's request, naming P's segment, granted");
    assert!(
        b1.granted_segments().contains(&seg),
        "P's segment sealed by B2"
    );
    assert_eq!(sealed_count(seg), 0);
    // P seals it; then seals it again, as after a lost answer.
    from_p.grant(&config, Some(seg)).expect("P's seal");
    assert_eq!(sealed_count(seg), 1);
    assert!(!b1.granted_segments().contains(&seg));
    from_p
        .grant(&config, Some(seg))
        .expect("a seal sent again is not refused");
    assert_eq!(sealed_count(seg), 1, "a segment sealed twice");
    cluster.shutdown();
}
