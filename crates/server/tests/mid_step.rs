//! Races inside one step of a role, replayed deterministically.
//!
//! On a real machine a role's step is not atomic: between two things one role
//! does in one step, the other roles — on other threads — run, and time passes.
//! Here the roles of an in-process cluster are stepped by hand, one at a time,
//! on a clock moved by hand (as the simulator steps them), and such a race is
//! replayed at one chosen point: the test clock runs a hook the first time it is
//! read once armed. A role that reads the clock in the middle of its step — a
//! worker admitting a request, the CM handling a lease request — is interrupted
//! right there, while the hook steps the other roles; or a role's step is given
//! a start time older than the clock, as a thread that read the clock and was
//! then not scheduled would have.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rowankv_client::{Client, ClientConfig, Completed, Op, OpId, Output};
use rowankv_cm::{ConfigManager, CoordStore, EmbeddedStore};
use rowankv_deploy::{build, ClusterConfig, Parts, CLIENT_NODE_BASE};
use rowankv_fabric::{Fabric, FaultInjector, LoopbackFabric, LoopbackNic};
use rowankv_server::{
    EventKind, EventLog, FailoverSettings, Placement, ServerSettings, ServerShared, Strategy, Task,
};
use rowankv_types::{Clock, NodeId, ShardId, Term, Version};
use rowankv_wire::config::Config;

/// A clock moved by hand that runs a hook the first time it is read once armed
/// (and, for a hook armed with a condition, the condition holds); the reader
/// then gets the time as the hook left it.
struct HookClock {
    now_ns: AtomicU64,
    hook: Mutex<Option<Hook>>,
}

/// A hook, and the condition under which a read of the clock runs it.
type Hook = (Box<dyn Fn() -> bool + Send>, Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for HookClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookClock")
            .field("now_ns", &self.now_ns.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl HookClock {
    fn advance_ns(&self, delta_ns: u64) {
        self.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
    }

    fn arm(&self, hook: impl FnOnce() + Send + 'static) {
        self.arm_when(|| true, hook);
    }

    /// Run `hook` at the first read of the clock at which `when` holds.
    fn arm_when(
        &self,
        when: impl Fn() -> bool + Send + 'static,
        hook: impl FnOnce() + Send + 'static,
    ) {
        *self.hook.lock().unwrap() = Some((Box::new(when), Box::new(hook)));
    }

    /// Take the hook off; whether it was still armed (never ran).
    fn disarm(&self) -> bool {
        self.hook.lock().unwrap().take().is_some()
    }
}

impl Clock for HookClock {
    fn now_ns(&self) -> u64 {
        // Taken out before it runs: the roles it steps read the clock too.
        let hook = {
            let mut armed = self.hook.lock().unwrap();
            match armed.as_ref() {
                Some((when, _)) if when() => armed.take(),
                _ => None,
            }
        };
        if let Some((_, hook)) = hook {
            hook();
        }
        self.now_ns.load(Ordering::SeqCst)
    }

    fn unix_ms(&self) -> u64 {
        rowankv_types::MANUAL_CLOCK_UNIX_MS_ORIGIN + self.now_ns.load(Ordering::SeqCst) / 1_000_000
    }
}

/// Every role of a cluster, each behind a lock, so that a hook running inside
/// one role's step can step all the others.
#[derive(Clone)]
struct Roles(Arc<Vec<Role>>);

/// A role's name, and the role.
type Role = (String, Mutex<Box<dyn Task>>);

impl Roles {
    /// Step once, at `now_ns`, every role not in the middle of a step already.
    fn step_all(&self, now_ns: u64) {
        for (_, task) in self.0.iter() {
            if let Ok(mut t) = task.try_lock() {
                t.step(now_ns);
            }
        }
    }

    /// Whether the role named `name` is in the middle of a step.
    fn mid_step(&self, name: &str) -> bool {
        let (_, task) = self
            .0
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no role {name}"));
        task.try_lock().is_err()
    }

    /// Step the role named `name` once, with `now_ns` as its step's start.
    fn step(&self, name: &str, now_ns: u64) {
        let (_, task) = self
            .0
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no role {name}"));
        task.lock().unwrap().step(now_ns);
    }
}

/// One round: time moves by `round_ns`, then every free role steps once.
fn round(clock: &HookClock, roles: &Roles, round_ns: u64) {
    clock.advance_ns(round_ns);
    roles.step_all(clock.now_ns());
}

/// An in-process cluster whose roles the test steps.
struct World {
    clock: Arc<HookClock>,
    parts: Parts,
    roles: Roles,
    round_ns: u64,
}

impl World {
    fn new(config: &ClusterConfig, round_ns: u64) -> World {
        let clock = Arc::new(HookClock {
            now_ns: AtomicU64::new(1_000_000),
            hook: Mutex::new(None),
        });
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let store: Arc<dyn CoordStore> = Arc::new(EmbeddedStore::in_memory(dyn_clock.clone()));
        let fabric = LoopbackFabric::with_clock(dyn_clock);
        let mut parts = build(config, fabric, store, None, Arc::new(EventLog::new()))
            .expect("building the cluster");
        let roles = parts
            .tasks
            .drain(..)
            .map(|(_, t)| (t.name().to_string(), Mutex::new(t)))
            .collect();
        let now = clock.now_ns();
        for s in &parts.servers {
            s.extend_lease(now + s.settings.failover.lease_ns);
        }
        World {
            clock,
            parts,
            roles: Roles(Arc::new(roles)),
            round_ns,
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    fn round(&self) {
        round(&self.clock, &self.roles, self.round_ns);
    }

    fn rounds(&self, n: usize) {
        for _ in 0..n {
            self.round();
        }
    }

    fn run_until(&self, what: &str, rounds_max: usize, mut done: impl FnMut() -> bool) {
        for _ in 0..rounds_max {
            if done() {
                return;
            }
            self.round();
        }
        assert!(done(), "{what}: not within {rounds_max} rounds");
    }

    fn server(&self, node: NodeId) -> Arc<ServerShared<LoopbackNic>> {
        self.parts
            .servers
            .iter()
            .find(|s| s.node == node)
            .expect("a member")
            .clone()
    }

    /// The configuration the coordination store holds.
    fn stored(&self) -> Arc<Config> {
        ConfigManager::open(self.parts.store.clone())
            .expect("the stored configuration")
            .current()
    }

    /// A client of worker 0 of every server that reports each server's answer
    /// as it is (no retries of unknown outcomes).
    fn client(&self) -> Client<LoopbackNic> {
        let nic = self
            .parts
            .fabric
            .attach(NodeId(CLIENT_NODE_BASE))
            .expect("a client NIC");
        let config = ClientConfig {
            clock: self.clock.clone(),
            worker_hint: 0,
            retry_unknown: false,
            timeout: std::time::Duration::from_secs(3600),
            attempt_timeout: std::time::Duration::from_secs(3600),
            ..ClientConfig::default()
        };
        let (clock, roles) = (self.clock.clone(), self.roles.clone());
        Client::connect_pumped(
            nic,
            self.parts.directory.clone(),
            self.parts.source.clone(),
            config,
            &mut || roles.step_all(clock.now_ns()),
        )
        .expect("a client")
    }

    /// Run until operation `id` of `client` completes.
    fn complete(&self, client: &mut Client<LoopbackNic>, id: OpId) -> Completed {
        let mut out = Vec::new();
        for _ in 0..100_000 {
            client.poll(&mut out);
            if let Some(i) = out.iter().position(|c| c.id == id) {
                return out.swap_remove(i);
            }
            self.round();
        }
        panic!("operation {id:?} never completed");
    }
}

/// Three servers of one worker each, one shard each, two replicas per shard
/// (so each shard has a server outside it), one CM.
fn cluster(failover: FailoverSettings) -> ClusterConfig {
    ClusterConfig {
        servers: 3,
        shards_per_server: 1,
        replication_factor: 2,
        strategy: Strategy::Rowan,
        settings: ServerSettings {
            workers: 1,
            inflight_max: 16,
            failover,
            ..ServerSettings::default()
        },
        pool_bytes: 24 << 20,
        segment_bytes: 256 << 10,
        placement: Placement::Shared { threads: 1 },
        keys_per_shard_expected: 64,
        cms: 1,
        ..ClusterConfig::default()
    }
}

/// When the CM became active.
fn cm_active_ns(world: &World) -> Option<u64> {
    world
        .parts
        .events
        .snapshot()
        .iter()
        .find(|e| matches!(e.kind, EventKind::CmActive { .. }))
        .map(|e| e.at_ns)
}

fn next_term(c: &Config) -> Config {
    let mut next = c.clone();
    next.term = Term(c.term.0 + 1);
    next
}

/// A key of `shard` in `config`, made from `tag`.
fn key_of(config: &Config, shard: ShardId, tag: &str) -> Vec<u8> {
    (0u32..)
        .map(|i| format!("{tag}-{i}").into_bytes())
        .find(|k| config.shard_for_key(k).shard == shard)
        .expect("a key of the shard")
}

/// What the hook saw while the worker was mid-step.
#[derive(Debug)]
struct MidStep {
    /// The hook ran inside the primary's worker's step.
    in_worker: bool,
    /// The write had been appended when the hook ran (then it was not mid-step).
    appended: bool,
    /// The primary committed the term with the joining backup meanwhile.
    committed: bool,
    /// The copy to the joining backup finished meanwhile.
    copied: bool,
}

/// Re-replication copies a shard to a joining backup only once no write that
/// started under an older term is in flight at the primary — also a write a
/// worker is still in the middle of. Here the worker has read its configuration
/// (the old term: the shard's backups without the joining one) and admitted a
/// PUT but not appended it, when the server adopts and commits the term with
/// the joining backup and its control role plans the copy. The write counts as
/// in flight from before the worker read its configuration
/// (`ServerShared::note_write_started`), so the copy waits for it: the joining
/// backup, once made a full backup, holds the acknowledged PUT. A copy taken
/// right then would miss it (it is not indexed before every ACK), and the write
/// itself goes only to the old term's backups. The race is replayed where the
/// worker reads the clock to admit the PUT (a write is admitted on the clock,
/// not at its step's start); the test says so if that read is gone.
#[test]
fn a_copy_taken_while_a_write_of_the_old_term_is_mid_step_waits_for_it() {
    const ROUND_NS: u64 = 100_000;
    let world = World::new(
        &cluster(FailoverSettings {
            // No lease runs out in this test: only the copy is under way.
            lease_ns: 10_000_000_000,
            renew_ns: 2_000_000,
            cm_lease_ns: 40_000_000_000,
            retry_ns: 1_000_000,
            ..FailoverSettings::default()
        }),
        ROUND_NS,
    );
    world.rounds(200);
    let c1 = world.stored();
    let s = c1.shards[0].clone();
    let (shard, primary) = (s.shard, s.primary);
    let joiner = c1
        .members
        .iter()
        .map(|m| m.node)
        .find(|n| !s.is_replica(*n))
        .expect("a server outside the shard");
    let mut client = world.client();
    let before_key = key_of(&c1, shard, "before");
    let key = key_of(&c1, shard, "mid-step");
    let id = client
        .submit(Op::Put {
            expires_at_ms: None,
            key: before_key.clone(),
            value: b"before".to_vec(),
        })
        .expect("a PUT submitted");
    let done = world.complete(&mut client, id);
    let Ok(Output::Written {
        version: before_version,
    }) = done.result
    else {
        panic!("the PUT before: {:?}", done.result);
    };

    // An operator moves the shard's backup to the outsider: stored when the
    // hook runs.
    let mut c2 = next_term(&c1);
    c2.shards[shard.0 as usize].backups.clear();
    c2.shards[shard.0 as usize].joining.push(joiner);
    let t2 = c2.term;

    let p = world.server(primary);
    let worker = format!("s{}-worker-0", primary.0);
    let puts_before = p.stats.puts.load(Ordering::Relaxed);
    let id = client
        .submit(Op::Put {
            expires_at_ms: None,
            key: key.clone(),
            value: b"mid-step".to_vec(),
        })
        .expect("the PUT submitted");

    // The hook runs when the primary's worker reads the clock to admit the PUT:
    // after it read its configuration (the old term), before it appends.
    let step_start = world.now();
    let seen: Arc<Mutex<Option<MidStep>>> = Arc::new(Mutex::new(None));
    {
        let (clock, roles, p) = (world.clock.clone(), world.roles.clone(), p.clone());
        let (store, events, seen) = (
            world.parts.store.clone(),
            world.parts.events.clone(),
            seen.clone(),
        );
        let worker = worker.clone();
        world.clock.arm(move || {
            let in_worker = roles.mid_step(&worker);
            let appended = p.stats.puts.load(Ordering::Relaxed) != puts_before;
            ConfigManager::open(store)
                .and_then(|m| m.commit(c2))
                .expect("the operator's configuration stored");
            // Every other role runs on: the CM prepares and commits the new
            // term, and the primary's control role plans the copy, and takes
            // it if it may.
            for _ in 0..20_000 {
                if p.committed_term() >= t2 {
                    break;
                }
                round(&clock, &roles, ROUND_NS);
            }
            let committed = p.committed_term() >= t2;
            for _ in 0..500 {
                round(&clock, &roles, ROUND_NS);
            }
            let copied = events.snapshot().iter().any(|e| {
                matches!(e.kind, EventKind::ReplicaCopied { shard: s, to, .. } if s == shard && to == joiner)
            });
            *seen.lock().unwrap() = Some(MidStep {
                in_worker,
                appended,
                committed,
                copied,
            });
        });
    }
    world.roles.step(&worker, step_start);
    assert!(
        !world.clock.disarm(),
        "the primary's worker did not read the clock in that step: the PUT was not admitted then"
    );
    let seen = seen.lock().unwrap().take().expect("the hook ran");
    assert!(
        seen.in_worker && !seen.appended && seen.committed,
        "not the interleaving under test: {seen:?}"
    );
    assert_eq!(
        p.stats.puts.load(Ordering::Relaxed),
        puts_before + 1,
        "the worker appends the PUT in the step the hook interrupted"
    );

    let done = world.complete(&mut client, id);
    let Ok(Output::Written { version }) = done.result else {
        panic!("the PUT mid-step: {:?}", done.result);
    };
    world.run_until(
        "the joining backup made a full one, the term committed everywhere",
        200_000,
        || {
            let c = world.stored();
            c.shard(shard).is_some_and(|a| a.backups.contains(&joiner))
                && world
                    .parts
                    .servers
                    .iter()
                    .all(|s| s.committed_term() >= c.term)
        },
    );

    // The joining backup holds what the copy took, and the write that was in
    // the middle of its step.
    let j = world.server(joiner);
    assert_eq!(
        j.engine
            .get(shard, &before_key)
            .expect("reading the backup"),
        Some((b"before".to_vec(), Version(before_version))),
        "{joiner} was copied {shard}"
    );
    assert_eq!(
        j.engine.get(shard, &key).expect("reading the backup"),
        Some((b"mid-step".to_vec(), Version(version))),
        "{joiner} became a full backup of {shard} without the PUT acknowledged at version \
         {version}, which a worker of {primary} had admitted under {} but not appended when \
         {t2} was committed (the copy finished while it was mid-step: {})",
        c1.term,
        seen.copied
    );
}

/// The CM counts a server's lease from the moment it handles the renewal, read
/// on its clock — not from the start of the step that handles it. The server's
/// lease runs from when it sent the renewal, and that can be after the CM's step
/// began: the CM's thread read the clock, then did not run while the server
/// sent. So the configuration that removes the server, once it has failed, is
/// committed only after the lease that renewal granted — and the margin — has
/// ended, never while the server may still serve under it.
#[test]
fn a_failed_server_is_removed_only_after_a_lease_granted_late_in_a_cm_step_ends() {
    const ROUND_NS: u64 = 1_000_000;
    const LEASE_NS: u64 = 200_000_000;
    const MARGIN_NS: u64 = 10_000_000;
    // From the CM's step start to the renewal: longer than two margins, so a
    // grant stamped at the step's start would let the server serve past the
    // commit; shorter than half a lease, so the CM does not count the time as
    // a stall of its own (`CmTask::discount_stall`).
    const LATE_NS: u64 = 60_000_000;
    let world = World::new(
        &cluster(FailoverSettings {
            lease_ns: LEASE_NS,
            renew_ns: 20_000_000,
            cm_lease_ns: 40_000_000_000,
            retry_ns: 1_000_000,
            lease_margin_ns: Some(MARGIN_NS),
            ..FailoverSettings::default()
        }),
        ROUND_NS,
    );
    world.rounds(100);
    let c1 = world.stored();
    let x = NodeId(2);
    let xs = world.server(x);
    assert!(cm_active_ns(&world).is_some(), "no active CM");

    // The CM's step begins at t0; its thread is not scheduled until t1. In
    // between, x sends a renewal, which that step handles.
    let t0 = world.now() + ROUND_NS;
    world.clock.advance_ns(ROUND_NS + LATE_NS);
    let t1 = world.now();
    let lease_role = format!("s{}-lease", x.0);
    world.roles.step(&lease_role, t1);
    world
        .roles
        .step(&format!("cm{}", rowankv_deploy::CM_NODE_BASE), t0);
    world.roles.step(&lease_role, t1);
    assert_eq!(
        xs.lease_until_ns(),
        t1 + LEASE_NS,
        "{x}'s renewal sent at {t1} was not granted in the CM's step of {t0}"
    );

    // x dies at once.
    world.parts.fabric.crash_node(x);
    world.parts.directory.unregister_node(x);
    xs.stop();
    let removal = |world: &World| {
        let events = world.parts.events.snapshot();
        let failed = events
            .iter()
            .position(|e| e.kind == EventKind::ServerFailed { node: x })?;
        let term = events[failed..].iter().find_map(|e| match e.kind {
            EventKind::ConfigStored { term } => Some(term),
            _ => None,
        })?;
        let (_, at) = world
            .parts
            .events
            .commits()
            .into_iter()
            .find(|(t, _)| *t == term)?;
        Some((term, at))
    };
    world.run_until("the failover that removes x committed", 10_000, || {
        removal(&world).is_some()
    });
    let (term, committed_ns) = removal(&world).expect("checked");
    assert!(term > c1.term);
    assert!(
        world.stored().member(x).is_none(),
        "{x} is still a member of term {term}"
    );
    let lease_end = xs.lease_until_ns();
    assert!(
        committed_ns >= lease_end + MARGIN_NS,
        "{term}, without {x}, was committed at {} ms, though the lease {x} was granted \
         for the renewal it sent at {} ms (handled by the CM in a step that began at {} ms) \
         runs until {} ms, and the margin until {} ms",
        committed_ns / 1_000_000,
        t1 / 1_000_000,
        t0 / 1_000_000,
        lease_end / 1_000_000,
        (lease_end + MARGIN_NS) / 1_000_000,
    );
}

/// The CM grants a lease only if it ends, with the margin, before the CM's own
/// lease does — judged when it handles the request, on its clock, not at the
/// start of the step that handles it: a renewal sent after that step began may
/// ask for a lease that would outlive the CM's own, and is then not granted.
/// Once the CM has renewed its own lease, the server's next renewal is.
#[test]
fn a_lease_request_handled_late_in_a_cm_step_is_granted_only_within_the_cms_own_lease() {
    const ROUND_NS: u64 = 1_000_000;
    const LEASE_NS: u64 = 200_000_000;
    const MARGIN_NS: u64 = 10_000_000;
    const CM_LEASE_NS: u64 = 1_000_000_000;
    let world = World::new(
        &cluster(FailoverSettings {
            lease_ns: LEASE_NS,
            renew_ns: 20_000_000,
            cm_lease_ns: CM_LEASE_NS,
            retry_ns: 1_000_000,
            lease_margin_ns: Some(MARGIN_NS),
            ..FailoverSettings::default()
        }),
        ROUND_NS,
    );
    world.run_until("an active CM", 100, || cm_active_ns(&world).is_some());
    world.rounds(10);
    // The CM's lease runs until `cm_until`: it renews it every quarter of
    // it, and has not yet.
    let active_ns = cm_active_ns(&world).expect("checked");
    let cm_until = active_ns + CM_LEASE_NS;
    assert!(world.now() < active_ns + CM_LEASE_NS / 4);
    let x = NodeId(2);
    let xs = world.server(x);

    // The CM's step begins at t0, when a lease granted then would end, with
    // the margin, before the CM's own; its thread is not scheduled until t1,
    // when one would not. In between, x sends a renewal, which that step
    // handles.
    let t0 = cm_until - LEASE_NS - MARGIN_NS - 10_000_000;
    let t1 = cm_until - LEASE_NS - MARGIN_NS + 10_000_000;
    world.clock.advance_ns(t1 - world.now());
    let lease_role = format!("s{}-lease", x.0);
    let cm = format!("cm{}", rowankv_deploy::CM_NODE_BASE);
    world.roles.step(&lease_role, t1);
    world.roles.step(&cm, t0);
    world.roles.step(&lease_role, t1);
    assert!(
        xs.lease_until_ns() < t1 + LEASE_NS,
        "the CM granted {x} a lease until {} ms, for a renewal sent at {} ms and handled \
         then, though its own lease ends at {} ms (margin {} ms); its step began at {} ms",
        xs.lease_until_ns() / 1_000_000,
        t1 / 1_000_000,
        cm_until / 1_000_000,
        MARGIN_NS / 1_000_000,
        t0 / 1_000_000,
    );

    // That step renewed the CM's own lease: x's next renewal is granted.
    world.run_until("x's next renewal granted", 100, || {
        xs.lease_until_ns() > t1 + LEASE_NS
    });
}

/// A worker admits a request on the clock when it handles it, not at the start
/// of its step (earlier requests of the step, or a pause of its thread, may
/// have taken a while): a PUT handled when the lease ends within the margin is
/// refused `Blocked` and not executed, though the lease held, with the margin,
/// when the step began.
#[test]
fn a_write_is_refused_when_the_lease_comes_within_the_margin_after_the_workers_step_began() {
    const MARGIN_NS: u64 = 100_000_000;
    let world = World::new(
        &cluster(FailoverSettings {
            lease_ns: 1_000_000_000,
            renew_ns: 20_000_000,
            cm_lease_ns: 40_000_000_000,
            retry_ns: 1_000_000,
            lease_margin_ns: Some(MARGIN_NS),
            ..FailoverSettings::default()
        }),
        1_000_000,
    );
    world.rounds(50);
    let config = world.stored();
    let (shard, primary) = (config.shards[0].shard, config.shards[0].primary);
    let p = world.server(primary);
    let mut client = world.client();
    // The primary's lease stays where it is: its lease role no longer runs.
    p.pause_lease_role(u64::MAX);
    let until = p.lease_until_ns();
    let (t0, t1) = (until - 3 * MARGIN_NS, until - MARGIN_NS / 2);
    assert!(world.now() < t0);

    let puts = p.stats.puts.load(Ordering::Relaxed);
    let blocked = p.stats.rejected_blocked.load(Ordering::Relaxed);
    client
        .submit(Op::Put {
            expires_at_ms: None,
            key: key_of(&config, shard, "late"),
            value: b"late".to_vec(),
        })
        .expect("the PUT submitted");
    // The worker's step begins at t0; it handles the PUT at t1.
    world.clock.advance_ns(t1 - world.now());
    world.roles.step(&format!("s{}-worker-0", primary.0), t0);
    assert_eq!(
        p.stats.puts.load(Ordering::Relaxed),
        puts,
        "a PUT handled {} ms before the lease ends (margin {} ms) was executed: its \
         worker's step began {} ms before the lease ends",
        (until - t1) / 1_000_000,
        MARGIN_NS / 1_000_000,
        (until - t0) / 1_000_000,
    );
    assert_eq!(
        p.stats.rejected_blocked.load(Ordering::Relaxed),
        blocked + 1,
        "the PUT was not refused Blocked"
    );
}

/// A GET is answered only if the lease still holds, with the margin, when the
/// answer goes out: the worker reads the clock again after reading the value,
/// since time passes between admitting a request and answering it. A GET
/// admitted well within the lease, whose lease comes within the margin while
/// it is read, is refused `Blocked`.
#[test]
fn a_get_is_refused_when_the_lease_comes_within_the_margin_while_it_is_read() {
    const MARGIN_NS: u64 = 100_000_000;
    let world = World::new(
        &cluster(FailoverSettings {
            lease_ns: 1_000_000_000,
            renew_ns: 20_000_000,
            cm_lease_ns: 40_000_000_000,
            retry_ns: 1_000_000,
            lease_margin_ns: Some(MARGIN_NS),
            ..FailoverSettings::default()
        }),
        1_000_000,
    );
    world.rounds(50);
    let config = world.stored();
    let (shard, primary) = (config.shards[0].shard, config.shards[0].primary);
    let p = world.server(primary);
    let mut client = world.client();
    let key = key_of(&config, shard, "read");
    let id = client
        .submit(Op::Put {
            expires_at_ms: None,
            key: key.clone(),
            value: b"v".to_vec(),
        })
        .expect("the PUT submitted");
    let done = world.complete(&mut client, id);
    assert!(
        matches!(done.result, Ok(Output::Written { .. })),
        "the PUT: {:?}",
        done.result
    );
    // The primary's lease stays where it is: its lease role no longer runs.
    p.pause_lease_role(u64::MAX);
    let until = p.lease_until_ns();
    let admitted_ns = until - 3 * MARGIN_NS;
    assert!(world.now() < admitted_ns);
    world.clock.advance_ns(admitted_ns - world.now());

    let gets = p.stats.gets.load(Ordering::Relaxed);
    let blocked = p.stats.rejected_blocked.load(Ordering::Relaxed);
    client.submit(Op::Get { key }).expect("the GET submitted");
    // Once the worker has admitted the GET and begun to read the value, the
    // next read of the clock finds the lease within the margin of its end.
    let worker = format!("s{}-worker-0", primary.0);
    let step_start = world.now();
    let in_worker: Arc<Mutex<Option<bool>>> = Arc::new(Mutex::new(None));
    {
        let (clock, roles, worker) = (world.clock.clone(), world.roles.clone(), worker.clone());
        let reading = p.clone();
        let seen = in_worker.clone();
        world.clock.arm_when(
            move || reading.stats.gets.load(Ordering::Relaxed) != gets,
            move || {
                *seen.lock().unwrap() = Some(roles.mid_step(&worker));
                clock.advance_ns(MARGIN_NS * 5 / 2);
            },
        );
    }
    world.roles.step(&worker, step_start);
    assert_eq!(
        p.stats.gets.load(Ordering::Relaxed),
        gets + 1,
        "the GET was not admitted and read"
    );
    assert_eq!(
        p.stats.rejected_blocked.load(Ordering::Relaxed),
        blocked + 1,
        "a GET admitted {} ms before the lease ends was answered though the lease came \
         within the margin ({} ms) of its end while the value was read",
        (until - admitted_ns) / 1_000_000,
        MARGIN_NS / 1_000_000,
    );
    assert_eq!(
        *in_worker.lock().unwrap(),
        Some(true),
        "the clock was read after the value was read, in the worker's step"
    );
}
