//! Fencing and lease timing against a running in-process cluster: who may
//! prepare, commit or probe a configuration at a server, who may renew a lease
//! or report a copy ready at the CM, which terms they may do it in, whose
//! answer a client takes, what a restarted CM tells servers is committed, when
//! a server stops answering before its lease ends, and that a backup that
//! adopted a configuration without a primary takes nothing more from it.
//!
//! Raw frames go out on an endpoint of the node being impersonated (a server's
//! machine, a CM's node after that CM was killed, or a client) and the answer
//! is read back on it, as in `bad_input.rs`.

mod common;
use common::recover_power_failure_image;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rowankv_client::{Client, ClientConfig, Completed, Op, Output};
use rowankv_cm::role::CmTask;
use rowankv_cm::{plan_failover, ConfigManager, CM_LEASE_KEY};
use rowankv_deploy::{Cluster, ClusterConfig, CM_NODE_BASE};
use rowankv_fabric::{Fabric, FaultInjector, LoopbackNic};
use rowankv_rpc::endpoint::{connect_pair, Endpoint, EndpointConfig, Event, PeerId};
use rowankv_server::control::{CM_PORT, CONTROL_PORT};
use rowankv_server::{EventKind, FailoverSettings, ServerSettings, Strategy};
use rowankv_types::{NodeId, Term, Version};
use rowankv_wire::config::Config;
use rowankv_wire::frame::{self, Body, Envelope, ErrorCode, Response, FRAME_BYTES_MAX_DEFAULT};

const SERVERS: usize = 3;
/// How long to wait for an answer that must come.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a frame that must not be answered is given to be answered anyway.
const SILENCE: Duration = Duration::from_millis(200);
/// Bound on waiting for the cluster to reach a state.
const WAIT_MAX: Duration = Duration::from_secs(30);

fn start(strategy: Strategy, rf: u8, failover: FailoverSettings, crash_sim: bool) -> Cluster {
    Cluster::start(ClusterConfig {
        strategy,
        servers: SERVERS,
        shards_per_server: 2,
        replication_factor: rf,
        pool_bytes: 32 << 20,
        segment_bytes: 1 << 20,
        keys_per_shard_expected: 256,
        crash_sim,
        settings: ServerSettings {
            workers: 1,
            failover,
            ..ServerSettings::default()
        },
        ..ClusterConfig::default()
    })
    .expect("a cluster")
}

fn client(cluster: &mut Cluster) -> Client<LoopbackNic> {
    common::client_of(
        cluster,
        ClientConfig {
            timeout: Duration::from_secs(10),
            ..ClientConfig::default()
        },
    )
    .expect("a client")
}

/// Wait until `done` holds, for at most `WAIT_MAX`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_MAX;
    while !done() {
        assert!(Instant::now() < deadline, "waited {WAIT_MAX:?} for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

/// The configuration after `c` with nothing changed but the term: what an
/// operator may store.
fn next_term(c: &Config) -> Config {
    let mut next = c.clone();
    next.term = Term(c.term.0 + 1);
    next
}

/// The CM that became active last.
fn active_cm(cluster: &Cluster) -> NodeId {
    let mut found = None;
    wait_for("an active CM", || {
        found = cluster
            .events()
            .snapshot()
            .iter()
            .rev()
            .find_map(|e| match e.kind {
                EventKind::CmActive { cm, .. } => Some(cm),
                _ => None,
            });
        found.is_some()
    });
    found.expect("waited for it")
}

/// Kill every CM: nobody prepares, commits or grants leases from now on.
fn kill_cms(cluster: &Cluster) {
    for j in 0..ClusterConfig::default().cms {
        cluster.kill_cm(j);
    }
}

/// An answer, owned.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ok(u64),
    Value(Vec<u8>),
    Segment(u32),
    Error(ErrorCode, String),
    Other(String),
}

/// An endpoint of `node` that sends raw frames and reads their answers.
struct Raw {
    node: NodeId,
    ep: Endpoint<LoopbackNic>,
    peers: HashMap<(NodeId, u16), PeerId>,
    next_request: u64,
    events: Vec<Event>,
    data: Vec<u8>,
}

impl Raw {
    fn on(nic: LoopbackNic) -> Raw {
        Raw {
            node: rowankv_fabric::Nic::node(&nic),
            ep: Endpoint::new(nic, EndpointConfig::default()).expect("an endpoint"),
            peers: HashMap::new(),
            next_request: 0x7261_7700_0000,
            events: Vec::new(),
            data: Vec::new(),
        }
    }

    fn peer(&mut self, cluster: &Cluster, to: NodeId, port: u16) -> PeerId {
        if let Some(&p) = self.peers.get(&(to, port)) {
            return p;
        }
        let p = cluster
            .directory()
            .connect(&mut self.ep, to, port, ANSWER_TIMEOUT)
            .unwrap_or_else(|e| panic!("{} connecting to {to}:{port}: {e}", self.node));
        self.peers.insert((to, port), p);
        p
    }

    /// An envelope of `config`'s cluster and term, from this node.
    fn envelope(&mut self, config: &Config) -> Envelope {
        self.next_request += 1;
        Envelope {
            cluster_id: config.cluster_id,
            term: config.term,
            request_id: self.next_request,
            sender: self.node,
        }
    }

    fn send(&mut self, cluster: &Cluster, to: NodeId, port: u16, env: &Envelope, body: &Body) {
        let mut bytes = Vec::new();
        frame::encode(&mut bytes, env, body, FRAME_BYTES_MAX_DEFAULT).expect("a valid frame");
        let peer = self.peer(cluster, to, port);
        self.ep.send_bytes(peer, &bytes).expect("sent");
    }

    /// The answer to request `id`, within `timeout`.
    fn answer(&mut self, id: u64, timeout: Duration) -> Option<Answer> {
        let deadline = Instant::now() + timeout;
        loop {
            self.ep
                .poll(&mut self.events, &mut self.data)
                .expect("polling");
            for ev in &self.events {
                let Event::Message { start, len, .. } = *ev else {
                    continue;
                };
                let f = frame::decode(&self.data[start..start + len]).expect("an answer decodes");
                if f.header.request_id != id {
                    continue;
                }
                return Some(match f.body {
                    Body::Response(Response::Ok { version }) => Answer::Ok(version),
                    Body::Response(Response::Value { value, .. }) => Answer::Value(value.to_vec()),
                    Body::Response(Response::Segment { segment, .. }) => Answer::Segment(segment),
                    Body::Response(Response::Error { code, detail, .. }) => {
                        Answer::Error(code, detail.to_string())
                    }
                    other => Answer::Other(format!("{other:?}")),
                });
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::yield_now();
        }
    }

    fn call(
        &mut self,
        cluster: &Cluster,
        to: NodeId,
        port: u16,
        env: &Envelope,
        body: &Body,
    ) -> Answer {
        self.send(cluster, to, port, env, body);
        self.answer(env.request_id, ANSWER_TIMEOUT)
            .unwrap_or_else(|| panic!("{to}:{port} did not answer {body:?} from {}", self.node))
    }
}

fn is_error(a: &Answer, code: ErrorCode) -> bool {
    matches!(a, Answer::Error(c, _) if *c == code)
}

// ---- Prepare, Commit and Ping at a server's control role ----

/// Only a CM prepares or commits a configuration, or probes a server: a server
/// (or anything else) that sends `Prepare`, `Commit` or `Ping` to a server's
/// control role is refused, and the configuration there does not move.
#[test]
fn a_prepare_commit_or_ping_from_a_server_is_refused_and_changes_nothing() {
    let cluster = start(Strategy::Rowan, 3, common::steady_leases(), false);
    kill_cms(&cluster);
    let c1 = cluster.cm().current();
    // An operator stores the next term; no CM runs its round.
    let c2 = cluster.cm().commit(next_term(&c1)).expect("storing term 2");
    let target = &cluster.servers()[0];
    assert_eq!((target.term(), target.committed_term()), (c1.term, c1.term));

    let mut raw = Raw::on(cluster.server_nic(1));
    let env = raw.envelope(&c2);
    let a = raw.call(
        &cluster,
        NodeId(0),
        CONTROL_PORT,
        &env,
        &Body::Prepare { term: c2.term },
    );
    assert!(is_error(&a, ErrorCode::NotMember), "Prepare from n1: {a:?}");
    assert_eq!(target.term(), c1.term, "a Prepare from n1 moved n0's term");

    let env = raw.envelope(&c2);
    let a = raw.call(
        &cluster,
        NodeId(0),
        CONTROL_PORT,
        &env,
        &Body::Commit { term: c2.term },
    );
    assert!(is_error(&a, ErrorCode::NotMember), "Commit from n1: {a:?}");
    assert_eq!(
        (target.term(), target.committed_term()),
        (c1.term, c1.term),
        "a Commit from n1 moved n0's configuration"
    );

    let env = raw.envelope(&c1);
    let a = raw.call(&cluster, NodeId(0), CONTROL_PORT, &env, &Body::Ping);
    assert!(is_error(&a, ErrorCode::NotMember), "Ping from n1: {a:?}");
    cluster.shutdown();
}

/// A CM's `Prepare` or `Commit` of a term older than the one a server holds
/// (a deposed CM's, or one delayed on the way) is refused with `StaleTerm` and
/// changes nothing: the server does not fetch a newer stored configuration on
/// its account, nor take anything as committed.
#[test]
fn a_prepare_or_commit_with_an_older_term_is_refused_and_changes_nothing() {
    let cluster = start(Strategy::Rowan, 3, common::steady_leases(), false);
    kill_cms(&cluster);
    let cm = NodeId(CM_NODE_BASE + 1);
    let nic = cluster.fabric().attach(cm).expect("the killed CM's node");
    let mut raw = Raw::on(nic);

    // Play the CM for term 2: every server prepares and commits it.
    let c1 = cluster.cm().current();
    let c2 = cluster.cm().commit(next_term(&c1)).expect("storing term 2");
    for m in &c2.members {
        let env = raw.envelope(&c2);
        let a = raw.call(
            &cluster,
            m.node,
            CONTROL_PORT,
            &env,
            &Body::Prepare { term: c2.term },
        );
        assert_eq!(a, Answer::Ok(c2.term.0), "Prepare of term 2 at {}", m.node);
    }
    for m in &c2.members {
        let env = raw.envelope(&c2);
        let a = raw.call(
            &cluster,
            m.node,
            CONTROL_PORT,
            &env,
            &Body::Commit { term: c2.term },
        );
        assert_eq!(a, Answer::Ok(c2.term.0), "Commit of term 2 at {}", m.node);
    }
    let target = &cluster.servers()[0];
    assert_eq!((target.term(), target.committed_term()), (c2.term, c2.term));

    // Term 3 is stored; then term 1's round arrives late.
    cluster.cm().commit(next_term(&c2)).expect("storing term 3");
    let env = raw.envelope(&c1);
    let a = raw.call(
        &cluster,
        NodeId(0),
        CONTROL_PORT,
        &env,
        &Body::Prepare { term: c1.term },
    );
    assert!(
        is_error(&a, ErrorCode::StaleTerm),
        "Prepare of term 1: {a:?}"
    );
    assert_eq!(
        target.term(),
        c2.term,
        "a Prepare of term 1 moved n0's term"
    );
    let env = raw.envelope(&c1);
    let a = raw.call(
        &cluster,
        NodeId(0),
        CONTROL_PORT,
        &env,
        &Body::Commit { term: c1.term },
    );
    assert!(
        is_error(&a, ErrorCode::StaleTerm),
        "Commit of term 1: {a:?}"
    );
    assert_eq!(
        (target.term(), target.committed_term()),
        (c2.term, c2.term),
        "a Commit of term 1 moved n0's configuration"
    );
    cluster.shutdown();
}

/// A member that holds a later stored configuration than the CM's round
/// refuses the round's `Prepare` as older: the CM moves the round on to the
/// stored term, and it commits everywhere (the round is not stuck on a member
/// that will never prepare an older term).
#[test]
fn a_round_a_member_refuses_as_older_moves_on_to_the_stored_term() {
    let cluster = start(Strategy::Rowan, 3, common::steady_leases(), false);
    let cm = active_cm(&cluster);
    let c1 = cluster.cm().current();
    wait_for("term 1 committed by the CM", || {
        cluster
            .events()
            .commits()
            .iter()
            .any(|(t, _)| *t == c1.term)
    });
    // The CM cannot reach n2 while it prepares term 2.
    let n2 = NodeId(2);
    cluster.fabric().cut_link(cm, n2);
    let c2 = cluster.cm().commit(next_term(&c1)).expect("storing term 2");
    wait_for("n0 and n1 to prepare term 2", || {
        cluster.servers()[..2].iter().all(|s| s.term() == c2.term)
    });
    // Term 3 is stored, and n2 reads it before the CM reaches it.
    let c3 = cluster.cm().commit(next_term(&c2)).expect("storing term 3");
    assert_eq!(cluster.servers()[2].refresh_config().term, c3.term);
    cluster.fabric().heal_link(cm, n2);
    wait_for("term 3 committed everywhere", || {
        cluster
            .servers()
            .iter()
            .all(|s| s.committed_term() == c3.term)
    });
    cluster.shutdown();
}

// ---- Lease and Ready at the CM ----

/// The active CM grants a lease only to a member of its configuration, of its
/// cluster, that asks in its own name.
#[test]
fn a_lease_request_from_another_cluster_or_a_non_member_is_refused() {
    let mut cluster = start(Strategy::Rowan, 3, common::steady_leases(), false);
    let cm = active_cm(&cluster);
    let config = cluster.cm().current();

    // From a server's machine, in its own name: granted.
    let mut server = Raw::on(cluster.server_nic(0));
    let env = server.envelope(&config);
    let a = server.call(&cluster, cm, CM_PORT, &env, &Body::Lease);
    assert!(matches!(a, Answer::Ok(_)), "n0's own lease: {a:?}");

    // The same with another cluster's id.
    let env = Envelope {
        cluster_id: config.cluster_id ^ 1,
        ..server.envelope(&config)
    };
    let a = server.call(&cluster, cm, CM_PORT, &env, &Body::Lease);
    assert!(
        is_error(&a, ErrorCode::WrongCluster),
        "another cluster: {a:?}"
    );

    // A client is not a member.
    let nic = cluster.attach_client().expect("a client NIC");
    let mut outsider = Raw::on(nic);
    let env = outsider.envelope(&config);
    let a = outsider.call(&cluster, cm, CM_PORT, &env, &Body::Lease);
    assert!(
        is_error(&a, ErrorCode::NotMember),
        "a client's lease: {a:?}"
    );

    // Nor may it ask in a member's name.
    let env = Envelope {
        sender: NodeId(0),
        ..outsider.envelope(&config)
    };
    outsider.send(&cluster, cm, CM_PORT, &env, &Body::Lease);
    if let Some(a) = outsider.answer(env.request_id, SILENCE) {
        assert!(
            !matches!(a, Answer::Ok(_)),
            "a lease granted in n0's name to a client"
        );
    }
    cluster.shutdown();
}

/// Only the shard's primary, in the CM's current term, reports a joining backup
/// ready: a `Ready` from anyone else, or from the primary in an older term, is
/// refused and the backup stays joining. The primary's own `Ready`, once it
/// really copied the shard, is taken.
#[test]
fn a_ready_not_from_the_shards_primary_in_its_term_is_refused_and_changes_nothing() {
    // Two replicas per shard of three servers: each shard has an outsider.
    let cluster = start(Strategy::Rowan, 2, common::steady_leases(), false);
    let cm = active_cm(&cluster);
    let c1 = cluster.cm().current();
    let s = c1.shards[0].clone();
    let (shard, primary) = (s.shard, s.primary);
    let joining = c1
        .members
        .iter()
        .map(|m| m.node)
        .find(|n| !s.is_replica(*n))
        .expect("an outsider");
    // The copy cannot reach the joining backup: no real Ready comes.
    cluster.fabric().cut_link(primary, joining);
    // An operator moves the shard's backup to the outsider.
    let mut c2 = next_term(&c1);
    c2.shards[shard.0 as usize].backups.clear();
    c2.shards[shard.0 as usize].joining.push(joining);
    let c2 = cluster
        .cm()
        .commit(c2)
        .expect("an operator's joining backup");
    wait_for("term 2 committed everywhere", || {
        cluster
            .servers()
            .iter()
            .all(|s| s.committed_term() == c2.term)
    });
    let still_joining = |cluster: &Cluster| {
        let c = cluster.cm().current();
        c.shard(shard).is_some_and(|a| a.joining.contains(&joining))
    };

    // The joining backup reports itself ready.
    let mut other = Raw::on(cluster.server_nic(joining.0 as usize));
    let env = other.envelope(&c2);
    let ready = Body::Ready {
        shard,
        node: joining,
    };
    let a = other.call(&cluster, cm, CM_PORT, &env, &ready);
    assert!(
        is_error(&a, ErrorCode::NotPrimary),
        "Ready from {joining}: {a:?}"
    );
    // The primary, in the term before the backup joined.
    let mut from_primary = Raw::on(cluster.server_nic(primary.0 as usize));
    let env = from_primary.envelope(&c1);
    let a = from_primary.call(&cluster, cm, CM_PORT, &env, &ready);
    assert!(is_error(&a, ErrorCode::StaleTerm), "Ready in term 1: {a:?}");
    // One more answer: the CM's steps that handled both are over.
    let env = other.envelope(&c2);
    other.call(&cluster, cm, CM_PORT, &env, &ready);
    assert!(
        still_joining(&cluster),
        "a joining backup that copied nothing was made a full backup: {:?}",
        cluster.cm().current().shard(shard)
    );

    // The primary copies, reports, and the CM takes it.
    cluster.fabric().heal_link(primary, joining);
    wait_for("the copied backup made a full one", || {
        !still_joining(&cluster)
            && cluster
                .cm()
                .current()
                .shard(shard)
                .is_some_and(|a| a.backups.contains(&joining))
    });
    cluster.shutdown();
}

/// A CM restarted as a standby (it crashed, or its machine did) answers leases
/// only with a term known committed, not with whatever term the store holds: a
/// stored term whose round did not finish may still have members that have not
/// prepared it.
#[test]
fn a_restarted_cm_answers_leases_only_with_a_committed_term() {
    // The CM lease expires within a few seconds of the CMs' death.
    let failover = FailoverSettings {
        lease_ns: 1_000_000_000,
        renew_ns: 50_000_000,
        cm_lease_ns: 3_000_000_000,
        ..FailoverSettings::default()
    };
    let cluster = start(Strategy::Rowan, 3, failover.clone(), false);
    let first = active_cm(&cluster);
    kill_cms(&cluster);
    let c1 = cluster.cm().current();
    // Stored by the dead CM, never prepared anywhere.
    let c2 = cluster.cm().commit(next_term(&c1)).expect("storing term 2");
    wait_for("the dead CM's lease to expire", || {
        cluster
            .store()
            .get(CM_LEASE_KEY)
            .expect("the store")
            .is_none()
    });

    // Restart it; it cannot reach n2, so its round of term 2 cannot finish.
    let nic = cluster.fabric().attach(first).expect("re-attaching the CM");
    cluster.fabric().cut_link(first, NodeId(2));
    let ep = Endpoint::new(nic, EndpointConfig::default()).expect("an endpoint");
    let acceptor = cluster.directory().register(first, CM_PORT);
    let manager = Arc::new(ConfigManager::open(cluster.store().clone()).expect("the CM's store"));
    let crashed = Arc::new(AtomicBool::new(false));
    let task = CmTask::new(
        first,
        manager,
        failover,
        ep,
        acceptor,
        cluster.directory().clone(),
        cluster.events().clone(),
        crashed.clone(),
        cluster.clock().clone(),
    );
    let mut cluster = cluster;
    cluster.spawn(Box::new(task));

    let mut raw = Raw::on(cluster.server_nic(0));
    let deadline = Instant::now() + WAIT_MAX;
    let granted = loop {
        let env = raw.envelope(&c1);
        raw.send(&cluster, first, CM_PORT, &env, &Body::Lease);
        match raw.answer(env.request_id, SILENCE) {
            Some(Answer::Ok(committed)) => break committed,
            // Still a standby, or not yet sure of its own lease.
            Some(Answer::Error(ErrorCode::Blocked, _)) | None => {}
            Some(other) => panic!("the restarted CM refused n0's lease: {other:?}"),
        }
        assert!(Instant::now() < deadline, "the restarted CM never granted");
    };
    assert_eq!(
        Term(granted),
        c1.term,
        "the restarted CM calls term {} committed while n2 never prepared it",
        c2.term
    );
    crashed.store(true, std::sync::atomic::Ordering::Release);
    cluster.shutdown();
}

// ---- Whom a client believes ----

/// A client takes an answer only from the server it asked, on the connection
/// it asked on: a frame from another node carrying the request's id — in the
/// asked server's name or its own — is dropped, and the real answer counts.
#[test]
fn a_response_from_a_node_not_asked_is_dropped_by_the_client() {
    let mut cluster = start(Strategy::Rowan, 3, common::steady_leases(), false);
    let mut c = client(&mut cluster);
    let config = cluster.cm().current();
    let key = (0u32..)
        .map(|i| format!("asked-{i}").into_bytes())
        .find(|k| config.shard_for_key(k).primary == NodeId(0))
        .expect("a key of n0");
    let version = c.put(&key, b"the real value").expect("the PUT");

    // n1's machine gets a connection to the client.
    let mut intruder =
        Endpoint::new(cluster.server_nic(1), EndpointConfig::default()).expect("an endpoint");
    let (to_client, _) = connect_pair(&mut intruder, c.endpoint_mut()).expect("connected");
    // n0's real answer takes a while (less than the client's attempt timeout).
    let delay = Duration::from_millis(100);
    cluster
        .fabric()
        .set_delay_ns(c.node(), NodeId(0), delay.as_nanos() as u64);

    let id = c.submit(Op::Get { key: key.clone() }).expect("submitted");
    // Answers to every request id the client may have used, in n0's name and
    // in n1's own.
    for request_id in 1..64 {
        for sender in [NodeId(0), NodeId(1)] {
            let env = Envelope {
                cluster_id: config.cluster_id,
                term: config.term,
                request_id,
                sender,
            };
            let body = Body::Response(Response::Value {
                expires_at_ms: None,
                version: version + 1000,
                value: b"forged",
            });
            let mut bytes = Vec::new();
            frame::encode(&mut bytes, &env, &body, FRAME_BYTES_MAX_DEFAULT).expect("a frame");
            intruder.send_bytes(to_client, &bytes).expect("sent");
        }
    }
    let mut out: Vec<Completed> = Vec::new();
    let deadline = Instant::now() + WAIT_MAX;
    let result = loop {
        c.poll(&mut out);
        if let Some(done) = out.iter().find(|d| d.id == id) {
            break done.result.clone();
        }
        assert!(Instant::now() < deadline, "the GET never completed");
        thread::yield_now();
    };
    assert_eq!(
        result,
        Ok(Output::Value {
            value: b"the real value".to_vec(),
            version,
            expires_at_ms: None,
        }),
        "the client took another node's answer"
    );
    cluster.fabric().set_delay_ns(c.node(), NodeId(0), 0);
    cluster.shutdown();
}

// ---- Lease timing at a server ----

/// Admission refuses a request when the lease ends within the margin, not only
/// once it has ended.
#[test]
fn admission_refuses_a_lease_that_ends_within_the_margin() {
    let failover = common::steady_leases();
    let margin = failover.lease_margin();
    assert_eq!(margin, failover.lease_ns / 10, "the default margin");
    let cluster = start(Strategy::Rowan, 3, failover, false);
    let s = &cluster.servers()[0];
    s.pause_lease_role(u64::MAX);
    let until = s.lease_until_ns();
    let term = s.term();
    assert_eq!(
        s.admit(until - 2 * margin, term),
        None,
        "well within the lease"
    );
    let refused = s.admit(until - margin / 2, term);
    assert!(
        matches!(refused, Some((ErrorCode::Blocked, _))),
        "admitted {} ms before the lease ends, with a margin of {} ms: {refused:?}",
        margin / 2_000_000,
        margin / 1_000_000
    );
    cluster.shutdown();
}

/// A GET that reaches the server when its lease ends within the margin is
/// refused `Blocked`, though the lease has not ended yet.
#[test]
fn a_get_is_refused_when_the_lease_ends_within_the_margin() {
    let margin = Duration::from_secs(3);
    let failover = FailoverSettings {
        lease_ns: 4_000_000_000,
        renew_ns: 100_000_000,
        cm_lease_ns: 16_000_000_000,
        lease_margin_ns: Some(margin.as_nanos() as u64),
        ..FailoverSettings::default()
    };
    let mut cluster = start(Strategy::Rowan, 3, failover, false);
    let mut c = client(&mut cluster);
    let config = cluster.cm().current();
    let key = (0u32..)
        .map(|i| format!("margin-{i}").into_bytes())
        .find(|k| config.shard_for_key(k).primary == NodeId(0))
        .expect("a key of n0");
    c.put(&key, b"v").expect("the PUT");
    let s = cluster.servers()[0].clone();
    let clock = cluster.clock().clone();
    // n0 stops renewing; wait until half the margin is left of its lease.
    s.pause_lease_role(u64::MAX);
    let half = margin.as_nanos() as u64 / 2;
    wait_for(
        "n0's lease to come within half the margin of its end",
        || clock.now_ns() + half >= s.lease_until_ns(),
    );
    let nic = cluster.attach_client().expect("a client NIC");
    let mut raw = Raw::on(nic);
    let env = raw.envelope(&config);
    let a = raw.call(&cluster, NodeId(0), 0, &env, &Body::Get { key: &key });
    let answered_ns = clock.now_ns();
    assert!(
        answered_ns < s.lease_until_ns(),
        "inconclusive: the lease ended before the GET was answered (a stall of {} ms)",
        (answered_ns - s.lease_until_ns()) / 1_000_000
    );
    assert!(
        is_error(&a, ErrorCode::Blocked),
        "a GET answered {} ms before the lease ends, with a margin of {margin:?}: {a:?}",
        (s.lease_until_ns() - answered_ns) / 1_000_000
    );
    cluster.shutdown();
}

// ---- Rowan landings after a primary's removal ----

/// Rowan landings carry no term: the fence is the queue pair. A backup that
/// adopted a configuration without the primary destroyed the primary's queue
/// pairs (`RowanReceiver::disconnect`), so a write the removed primary still
/// sends — it has not learnt of its removal — never lands there, while a
/// backup that has not adopted it yet still takes it.
#[test]
fn a_removed_primarys_landing_is_refused_by_a_backup_that_adopted_its_removal() {
    let mut cluster = start(Strategy::Rowan, 3, common::steady_leases(), true);
    let mut c = client(&mut cluster);
    let config = cluster.cm().current();
    let primary = NodeId(0);
    let shard = config
        .primary_shards(primary)
        .next()
        .expect("a shard of the primary")
        .shard;
    let mut of_shard = (0u32..)
        .map(|i| format!("landing-{i}").into_bytes())
        .filter(|k| config.shard_for_key(k).shard == shard);
    let before = of_shard.next().expect("a key of the shard");
    let after = of_shard.next().expect("another key of the shard");
    let v = c
        .put(&before, b"before the removal")
        .expect("the PUT before");
    let held = |node: NodeId, key: &[u8]| {
        recover_power_failure_image(&cluster.servers()[node.0 as usize])
            .get(shard, key)
            .unwrap()
            .map(|(v, n)| (String::from_utf8_lossy(&v).into_owned(), n))
    };
    let (b1, b2) = (NodeId(1), NodeId(2));
    for b in [b1, b2] {
        assert_eq!(
            held(b, &before),
            Some(("before the removal".into(), Version(v))),
            "backup {b} before the removal"
        );
    }

    // b1 adopts the configuration that removes the primary; the primary and b2
    // have not heard of it.
    let next = plan_failover(&config, &[primary]).expect("a failover plan");
    assert!(cluster.servers()[1].adopt(Arc::new(next)), "b1 adopts");
    let outcome = c.put(&after, b"after the removal");
    assert!(
        outcome.is_err(),
        "a write b1 cannot hold was acknowledged: {outcome:?}"
    );
    assert_eq!(
        held(b1, &after),
        None,
        "the removed primary's write landed at b1"
    );
    assert!(
        held(b2, &after).is_some(),
        "b2, which still has the primary in its configuration, should hold the write"
    );
    cluster.shutdown();
}

/// A replication path (`ROWAN_SERVICE`, `REMOTE_LOG_SERVICE`) is opened only
/// for another member of the configuration the server holds, naming its
/// worker: a removed server may not open a new path past the fence, and a
/// request without its worker's key is refused rather than accepted unkeyed.
#[test]
fn replication_paths_are_refused_to_non_members_and_to_requests_without_a_worker() {
    use rowankv_fabric::QpAddr;
    use rowankv_server::services::{
        encode_path_request, PathKey, REMOTE_LOG_SERVICE, ROWAN_SERVICE,
    };
    use rowankv_types::QpNum;
    for (strategy, service) in [
        (Strategy::Rowan, ROWAN_SERVICE),
        (Strategy::Rwrite, REMOTE_LOG_SERVICE),
    ] {
        let cluster = start(strategy, 3, FailoverSettings::default(), false);
        let ask = |from: u32, private: Vec<u8>| {
            let from = QpAddr {
                node: NodeId(from),
                qpn: QpNum(77),
            };
            cluster
                .directory()
                .request(NodeId(0), service, from, private)
                .expect("a request")
                .recv_timeout(ANSWER_TIMEOUT)
                .expect("an answer")
        };
        let key = |worker| {
            encode_path_request(PathKey {
                worker,
                incarnation: 1,
            })
        };
        let e = ask(999, key(0)).expect_err("a non-member");
        assert!(e.contains("n999 is not a peer server"), "{strategy}: {e}");
        let e = ask(0, key(0)).expect_err("the server itself");
        assert!(e.contains("not a peer server"), "{strategy}: {e}");
        let e = ask(1, Vec::new()).expect_err("no worker");
        assert!(e.contains("of 0 bytes, not 10"), "{strategy}: {e}");
        let e = ask(1, 5u16.to_le_bytes().to_vec()).expect_err("no process");
        assert!(e.contains("of 2 bytes, not 10"), "{strategy}: {e}");
        // A member naming its worker is admitted: what stops this one is only
        // that no queue pair qp77 exists on its node to connect to.
        let e = ask(1, key(5)).expect_err("no such queue pair");
        assert!(e.contains("qp77 } does not exist"), "{strategy}: {e}");
    }
}

/// A remote log ends when another path of its sender replaces the one that
/// writes it: the backup closes every path that could still land a WRITE in
/// it (that worker's under `rwrite`; every path of the sender under `share`,
/// whose workers share the log), seals its segments, and refuses its id from
/// then on (`UnknownLog`), so a grant or seal request still on its way from
/// the old path touches nothing of the new one. The new path gets a new log.
#[test]
fn a_replaced_remote_log_path_ends_its_log_and_a_request_naming_it_is_refused() {
    use rowankv_fabric::{CompletionQueue, CqKind, Nic, Op, QueuePair, WcStatus, WorkRequest};
    use rowankv_server::services::{
        decode_log_answer, encode_path_request, PathKey, REMOTE_LOG_SERVICE,
    };
    for strategy in [Strategy::Rwrite, Strategy::Share] {
        let cluster = start(strategy, 3, common::steady_leases(), false);
        let backup = NodeId(0);
        let server = &cluster.servers()[0];
        // The sender's own process: another incarnation would end every
        // path of the sender, its real workers' too.
        let incarnation = cluster.servers()[1].incarnation;
        let nic = cluster.server_nic(1);
        let cq = nic.create_cq(CqKind::Ring { capacity: 16 }).unwrap();
        let dial = |worker: u16| {
            let qp = nic.create_qp(&cq, &cq, None, 16).unwrap();
            let key = PathKey {
                worker,
                incarnation,
            };
            let a = cluster
                .directory()
                .request(
                    backup,
                    REMOTE_LOG_SERVICE,
                    qp.addr(),
                    encode_path_request(key),
                )
                .expect("a request")
                .recv_timeout(ANSWER_TIMEOUT)
                .expect("an answer")
                .expect("accepted");
            let (region, epoch) = decode_log_answer(&a.private, backup).unwrap();
            qp.connect(a.qp).unwrap();
            (qp, region, epoch.log)
        };
        let mut raw = Raw::on(nic.clone());
        let config = cluster.cm().current();
        let mut ask = |log: u32, sealed: Option<u32>| {
            let env = raw.envelope(&config);
            raw.call(
                &cluster,
                backup,
                0,
                &env,
                &Body::GrantSegment { log, sealed },
            )
        };
        let segment_of = |a: Answer| match a {
            Answer::Segment(s) => s,
            other => panic!("{strategy}: no segment granted: {other:?}"),
        };

        let (qp_a, region, log_a) = dial(7);
        let (qp_b, _, log_b) = dial(8);
        assert_eq!(
            log_a == log_b,
            strategy == Strategy::Share,
            "{strategy}: logs {log_a}, {log_b}"
        );
        let seg_a = segment_of(ask(log_a, None));
        let seg_b = segment_of(ask(log_b, None));
        assert!(server.granted_segments().contains(&seg_a));

        // Worker 7 dials again: its log ends.
        let (_qp_a2, _, log_a2) = dial(7);
        assert_ne!(log_a2, log_a, "{strategy}: the replaced path's log goes on");
        assert!(
            !server.granted_segments().contains(&seg_a),
            "{strategy}: the ended log's segment {seg_a} was not sealed"
        );
        let a = ask(log_a, Some(seg_a));
        assert!(
            is_error(&a, ErrorCode::UnknownLog),
            "{strategy}: a grant for the ended log: {a:?}"
        );

        // The other worker's path: under `share` it wrote the same log, and is
        // closed (its WRITE fails, its requests are refused); under `rwrite`
        // its own log goes on.
        let write = WorkRequest::new(
            1,
            Op::Write {
                data: &[1; 64],
                remote: region.at(0),
                imm: None,
            },
        )
        .persisted();
        qp_b.post_send(&[write]).unwrap();
        let mut done = [rowankv_fabric::Completion::BLANK; 1];
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        while cq.poll(&mut done).unwrap() == 0 {
            assert!(
                Instant::now() < deadline,
                "{strategy}: the WRITE never completed"
            );
            thread::yield_now();
        }
        let b = ask(log_b, None);
        if strategy == Strategy::Share {
            assert_ne!(
                done[0].status,
                WcStatus::Success,
                "{strategy}: a WRITE landed through a closed path"
            );
            assert!(is_error(&b, ErrorCode::UnknownLog), "{strategy}: {b:?}");
            assert!(!server.granted_segments().contains(&seg_b));
            // Worker 8 dials again and shares worker 7's new log.
            let (_qp_b2, _, log_b2) = dial(8);
            assert_eq!(
                log_b2, log_a2,
                "{strategy}: the workers do not share the new log"
            );
        } else {
            assert_eq!(
                done[0].status,
                WcStatus::Success,
                "{strategy}: worker 8's path was closed"
            );
            let seg = segment_of(b);
            assert!(
                server.granted_segments().contains(&seg_b)
                    && server.granted_segments().contains(&seg)
            );
        }
        // A seal is honoured only from the log the segment was granted to.
        let seg_new = segment_of(ask(log_a2, None));
        let other = segment_of(ask(log_a2, None));
        if strategy == Strategy::Rwrite {
            let a = ask(log_b, Some(seg_new));
            assert!(matches!(a, Answer::Segment(_)), "{strategy}: {a:?}");
            assert!(
                server.granted_segments().contains(&seg_new),
                "{strategy}: another log sealed {seg_new}"
            );
        }
        let a = ask(log_a2, Some(seg_new));
        assert!(matches!(a, Answer::Segment(_)), "{strategy}: {a:?}");
        assert!(!server.granted_segments().contains(&seg_new));
        assert!(server.granted_segments().contains(&other));
        drop(qp_a);
        cluster.shutdown();
    }
}
