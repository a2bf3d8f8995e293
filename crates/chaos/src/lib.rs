//! `rowankv chaos`: RowanKV's chaos tester against real processes on this host.
//!
//! It owns a whole run: it starts a real etcd, two CMs on it and the servers
//! (RF 3) as processes of the `rowankv` binary over the `tcp` fabric
//! ([`cluster`]), each CM and server in a network namespace of its own on a
//! bridge the run creates ([`net`]), puts a load on them from client
//! processes ([`fleet`]) that journal every operation in the simulator's
//! history format ([`clients`]), injects faults drawn from a seed
//! ([`schedule`]) — `kill -9` of a server, of the active CM, of a client,
//! SIGSTOP of a server past its lease, a power cut of the whole cluster,
//! partitions, a one-way cut, a slow link, a clock jump — printing each as it
//! happens and writing it to `faults.log`, then heals everything, waits until
//! the cluster is back to full replication, reads every key back and checks
//! the merged history with the simulator's own checker (`rowankv_sim::check`):
//! no acknowledged write lost, every key linearizable, no answer from a
//! configuration older than one already committed. A process that exited
//! without being killed is a violation too.
//!
//! It must never depend on the internals of the processes it tests: it reaches
//! them as an operator would — configuration files, signals, the client
//! library, `rowankv status`'s calls, `rowankv clock-step`, etcd (read only),
//! and the network between them.
//!
//! Invariants: every child process is killed when a run ends, whatever way it
//! ends (even when the chaos process is killed: they die with it), and its
//! network removed (a killed chaos process's by the next run); the schedule
//! depends on the seed and the options only; a write is recorded `fail` only
//! when the client knows it had no effect.
#![deny(unsafe_code)]

pub mod clients;
pub mod cluster;
pub mod fleet;
pub mod net;
pub mod schedule;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rowankv_deploy::client::{attach_client, server_stats, Remembering};
use rowankv_deploy::Attached;
use rowankv_sim::check::{check_with_budget, ConfigCommit, ViolationKind};
use rowankv_sim::history::{History, OpKind, Status};
use rowankv_wire::config::{Config, ConfigSource};
use serde::Serialize;

use crate::clients::Load;
use crate::cluster::{Cluster, Layout};
use crate::fleet::Fleet;
use crate::net::{Net, Space};
use crate::schedule::{Fault, FaultKind, ScheduleShape};

/// Errors that end a run before its checks (bad options, a cluster that never
/// came up, files that cannot be written). Violations found by the checks are
/// not errors: they are in [`Summary::violations`].
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    #[error("{0}")]
    Options(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("cluster: {0}")]
    Cluster(String),
}

/// Bounds of the options.
pub const SERVERS_MIN: usize = 3;
pub const SERVERS_MAX: usize = 16;
pub const CLIENTS_MAX: usize = 64;
pub const KEYS_MAX: usize = 100_000;
pub const LEASE_MS_MIN: u64 = 100;
pub const LEASE_MS_MAX: u64 = 10_000;
pub const SECONDS_MAX: f64 = 24.0 * 3600.0;

/// The options of a run.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// Length of the load; the load goes on until every scheduled fault was
    /// injected and healed, if that takes longer.
    pub seconds: f64,
    pub seed: u64,
    /// The run's directory: absent or empty.
    pub dir: PathBuf,
    pub servers: usize,
    pub clients: usize,
    pub keys: usize,
    /// Zipf exponent of the key choice.
    pub zipf: f64,
    /// The servers' lease (the CMs' `lease_ms`).
    pub lease_ms: u64,
    /// How long the cluster may take to return to full replication after a
    /// fault is healed.
    pub recover_timeout_s: f64,
    /// The `rowankv` binary.
    pub bin: PathBuf,
    /// The `etcd` binary.
    pub etcd: PathBuf,
    /// Search steps per key of the linearizability check.
    pub check_budget: u64,
    /// Every CM and server in a network namespace of its own, and network
    /// faults planned (`--net netns`, the default; needs root, iproute2 and
    /// nftables); otherwise all on loopback without them (`--net loopback`).
    pub netns: bool,
    /// A planted bug (`--planted serve-without-lease`): every server answers
    /// without a valid lease. The run must then fail.
    pub planted_serve_without_lease: bool,
}

impl ChaosOptions {
    /// Defaults for everything but what a run must be told.
    pub fn new(seconds: f64, seed: u64, dir: PathBuf, bin: PathBuf) -> ChaosOptions {
        ChaosOptions {
            seconds,
            seed,
            dir,
            servers: 5,
            clients: 8,
            keys: 200,
            zipf: 0.99,
            lease_ms: 500,
            recover_timeout_s: 60.0,
            bin,
            etcd: PathBuf::from("etcd"),
            check_budget: 20_000_000,
            netns: true,
            planted_serve_without_lease: false,
        }
    }

    /// Whether the options make a run; the first problem otherwise.
    pub fn check(&self) -> Result<(), ChaosError> {
        let bad = |m: String| Err(ChaosError::Options(m));
        if !(self.seconds.is_finite() && self.seconds > 0.0 && self.seconds <= SECONDS_MAX) {
            return bad(format!(
                "--seconds {}: a duration in (0, {SECONDS_MAX}]",
                self.seconds
            ));
        }
        if !(SERVERS_MIN..=SERVERS_MAX).contains(&self.servers) {
            return bad(format!(
                "--servers {}: {SERVERS_MIN}..={SERVERS_MAX} (replication factor 3)",
                self.servers
            ));
        }
        if !(1..=CLIENTS_MAX).contains(&self.clients) {
            return bad(format!("--clients {}: 1..={CLIENTS_MAX}", self.clients));
        }
        if !(1..=KEYS_MAX).contains(&self.keys) {
            return bad(format!("--keys {}: 1..={KEYS_MAX}", self.keys));
        }
        if !(self.zipf.is_finite() && self.zipf > 0.0 && self.zipf <= 10.0) {
            return bad(format!("--zipf {}: an exponent in (0, 10]", self.zipf));
        }
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&self.lease_ms) {
            return bad(format!(
                "--lease-ms {}: {LEASE_MS_MIN}..={LEASE_MS_MAX}",
                self.lease_ms
            ));
        }
        if !(self.recover_timeout_s.is_finite() && self.recover_timeout_s >= 1.0) {
            return bad(format!(
                "--recover-timeout-s {}: at least 1",
                self.recover_timeout_s
            ));
        }
        if self.check_budget == 0 {
            return bad("--check-budget 0: at least one search step".into());
        }
        if !self.bin.is_file() {
            return bad(format!(
                "the rowankv binary {} does not exist",
                self.bin.display()
            ));
        }
        if let Ok(mut entries) = std::fs::read_dir(&self.dir) {
            if entries.next().is_some() {
                return bad(format!(
                    "--dir {} is not empty: give a new directory (a run's files are not overwritten)",
                    self.dir.display()
                ));
            }
        } else if self.dir.exists() {
            return bad(format!("--dir {} is not a directory", self.dir.display()));
        }
        Ok(())
    }

    /// The command line that replays this run's schedule (into another
    /// directory: a run never overwrites one).
    pub fn replay_command(&self) -> String {
        format!(
            "rowankv chaos --seconds {} --seed {} --servers {} --clients {} --keys {} --zipf {} --lease-ms {} --net {} --dir {}-replay",
            self.seconds,
            self.seed,
            self.servers,
            self.clients,
            self.keys,
            self.zipf,
            self.lease_ms,
            if self.netns { "netns" } else { "loopback" },
            self.dir.display()
        ) + if self.planted_serve_without_lease {
            " --planted serve-without-lease"
        } else {
            ""
        }
    }

    fn shape(&self) -> ScheduleShape {
        ScheduleShape {
            seconds_ms: (self.seconds * 1_000.0) as u64,
            servers: self.servers,
            lease_ms: self.lease_ms,
            network: self.netns,
            clients: self.clients,
        }
    }
}

/// The figures of a run (`summary.json`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub seed: u64,
    pub seconds: f64,
    pub servers: usize,
    pub clients: usize,
    /// One-key readers: one per server that led a shard at the start, and
    /// one more before each fault that cuts a server off, on a key it leads
    /// then.
    pub readers: usize,
    /// Client processes started, every life of every client and reader
    /// (`kill-client` starts a new one).
    pub client_processes: usize,
    /// Operations whose client was killed before their outcome was known
    /// (counted among `unknown`).
    pub cut_by_kills: u64,
    pub keys: usize,
    pub lease_ms: u64,
    /// The network: `netns` (a namespace per process, network faults) or
    /// `loopback`.
    pub net: String,
    /// The planted bug, if any (the run must then fail).
    pub planted: Option<String>,
    /// From the start of the cluster to the end of the checks.
    pub elapsed_s: f64,
    /// Of the load, from the first operation to the last.
    pub load_s: f64,
    /// Operations of the load (the read-back not included).
    pub operations: u64,
    pub acknowledged_writes: u64,
    pub reads_ok: u64,
    pub unknown: u64,
    pub failed: u64,
    pub final_reads: u64,
    pub faults_planned: usize,
    pub faults_injected: usize,
    pub faults_by_kind: BTreeMap<String, u64>,
    /// Pauses during which the stopped server was seen evicted (a pause the
    /// active CM's startup grace covered is not one).
    pub pauses_evicted: u64,
    pub migrations: MigrationCounts,
    /// Configuration terms seen committed in etcd during the run.
    pub commits_observed: usize,
    pub first_term: u64,
    pub last_term: u64,
    pub checker: String,
    pub inconclusive_keys: usize,
    /// Every violation found: checker, crashed processes, unreadable keys, a
    /// cluster that did not recover. Empty: the run passed.
    pub violations: Vec<String>,
    pub replay: String,
}

impl Summary {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What the `migrate` faults did.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct MigrationCounts {
    /// Moves the CM listed.
    pub started: u64,
    /// Listed moves that ended with the shard at its target.
    pub finished: u64,
    /// Listed moves that ended with the shard elsewhere (its target killed).
    pub rolled_back: u64,
    /// Moves not made: the CM refused them (a reconfiguration under way),
    /// or the target was no member, or held a replica of every shard.
    pub refused: u64,
}

/// The run's event log: printed, and appended to `faults.log`.
struct Events {
    file: Mutex<BufWriter<File>>,
    start: Instant,
}

impl Events {
    fn say(&self, line: &str) {
        let t = self.start.elapsed().as_secs_f64();
        let text = format!("t={t:8.3}s {line}");
        println!("{text}");
        let mut f = self.file.lock();
        let _ = writeln!(f, "{text}");
        let _ = f.flush();
    }
}

/// How long the observer waits for the CMs' or a server's answer.
const OBSERVER_TIMEOUT: Duration = Duration::from_secs(2);

/// A client node of the chaos process that watches the configuration through
/// the CMs (what `rowankv status` shows).
struct Observer {
    attached: Option<(Attached, Arc<Remembering>)>,
}

impl Observer {
    /// The configuration the CMs serve now.
    fn config(&mut self, c: &Cluster) -> Result<Arc<Config>, String> {
        if self.attached.is_none() {
            let a = attach_client(
                c.layout.cluster_id,
                &c.secret,
                &c.cm_addrs,
                OBSERVER_TIMEOUT,
            )
            .map_err(|e| format!("no configuration from the CMs: {e}"))?;
            self.attached = Some(a);
        }
        let (_, source) = self.attached.as_ref().expect("attached above");
        source.fetch().map_err(|e| {
            self.attached = None;
            format!("no configuration from the CMs: {e}")
        })
    }

    /// What keeps the cluster from full replication now (`Ok(term)`: nothing).
    /// Servers in `excused` need not be members (they were already reported
    /// for not rejoining).
    fn replication(&mut self, c: &Cluster, excused: &BTreeSet<usize>) -> Result<u64, String> {
        let config = self.config(c)?;
        let (net, _) = self.attached.as_ref().expect("attached by config()");
        let timeout = OBSERVER_TIMEOUT;
        for (i, addr) in c.server_addrs.iter().enumerate() {
            if !excused.contains(&i)
                && !config
                    .members
                    .iter()
                    .any(|m| m.address.as_deref() == Some(addr.as_str()))
            {
                return Err(format!(
                    "term {}: server-{i} ({addr}) is not a member",
                    config.term.0
                ));
            }
        }
        if let Some(m) = config.members.iter().find(|m| {
            !c.server_addrs
                .iter()
                .any(|a| m.address.as_deref() == Some(a.as_str()))
        }) {
            return Err(format!(
                "term {}: {} at {:?} is a member, not one of this run's servers",
                config.term.0, m.node, m.address
            ));
        }
        let rf = usize::from(config.replication_factor);
        for s in &config.shards {
            if s.backups.len() + 1 < rf || !s.joining.is_empty() {
                return Err(format!(
                    "term {}: shard {} has {} full replicas of {rf}, {} joining",
                    config.term.0,
                    s.shard.0,
                    s.backups.len() + 1,
                    s.joining.len()
                ));
            }
        }
        for m in &config.members {
            let stats = server_stats(net, c.layout.cluster_id, m.node, timeout)
                .map_err(|e| format!("term {}: {} does not answer: {e}", config.term.0, m.node))?;
            let lease = stats["lease_remaining_ms"].as_f64().unwrap_or(0.0);
            if lease <= 0.0 {
                return Err(format!("term {}: {} holds no lease", config.term.0, m.node));
            }
        }
        Ok(config.term.0)
    }
}

/// The run in progress.
struct Run {
    opts: ChaosOptions,
    cluster: Cluster,
    events: Arc<Events>,
    observer: Observer,
    start: Instant,
    violations: Vec<String>,
    /// Crashes already printed.
    crashes_reported: usize,
    /// When the CM holding the active lease now was first seen holding it.
    active_since: Arc<Mutex<Option<Instant>>>,
    /// Pauses during which the stopped server was seen evicted.
    pauses_evicted: u64,
    migrations: MigrationCounts,
    /// The client processes, while the load runs.
    fleet: Option<Fleet>,
}

impl Run {
    fn t_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Reap children that exited by themselves, and say so at once.
    fn watch(&mut self) {
        self.cluster.watch();
        while self.crashes_reported < self.cluster.crashes.len() {
            let (name, status) = &self.cluster.crashes[self.crashes_reported];
            self.events.say(&format!(
                "VIOLATION {name} exited without being killed: {status}"
            ));
            self.crashes_reported += 1;
        }
    }

    /// This run's servers that the configuration the CMs serve does not hold.
    fn missing_members(&mut self) -> BTreeSet<usize> {
        let Ok(config) = self.observer.config(&self.cluster) else {
            return BTreeSet::new();
        };
        (0..self.cluster.server_addrs.len())
            .filter(|&i| {
                let a = &self.cluster.server_addrs[i];
                !config
                    .members
                    .iter()
                    .any(|m| m.address.as_deref() == Some(a.as_str()))
            })
            .collect()
    }

    /// Sleep `d`, reaping crashed children meanwhile.
    fn hold(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.watch();
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
    }

    /// Wait until the cluster is back to full replication, at most `timeout`.
    fn wait_healthy(&mut self, timeout: Duration) -> Result<u64, String> {
        self.wait_healthy_excusing(timeout, &BTreeSet::new())
    }

    /// As [`Run::wait_healthy`], `excused` servers need not be members.
    fn wait_healthy_excusing(
        &mut self,
        timeout: Duration,
        excused: &BTreeSet<usize>,
    ) -> Result<u64, String> {
        let deadline = Instant::now() + timeout;
        loop {
            self.watch();
            match self.observer.replication(&self.cluster, excused) {
                Ok(term) => return Ok(term),
                Err(why) if Instant::now() > deadline => return Err(why),
                Err(_) => self.hold(Duration::from_millis(250)),
            }
        }
    }

    fn inject(&mut self, f: &Fault) -> Result<(), ChaosError> {
        let hold = Duration::from_millis(f.hold_ms);
        match f.kind {
            FaultKind::KillServer => {
                let i = f.server.expect("a server fault names its server");
                let pid = self.cluster.kill_server(i);
                self.events.say(&format!(
                    "fault {}: kill -9 server-{i} (pid {}); restart in {} ms",
                    f.index,
                    pid_text(pid),
                    f.hold_ms
                ));
                self.hold(hold);
                let pid = self.cluster.start_server(i, self.t_s())?;
                self.events.say(&format!(
                    "heal {}: server-{i} restarted on its pool (pid {pid})",
                    f.index
                ));
            }
            FaultKind::PauseServer => {
                let i = f.server.expect("a server fault names its server");
                // A CM that became active counts no lease for a while (its
                // startup grace): a pause then would not evict the server.
                let grace = Duration::from_millis((10 * self.opts.lease_ms).max(2_000) + 500);
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let since = *self.active_since.lock();
                    let wait = match since {
                        Some(t) => (t + grace).checked_duration_since(Instant::now()),
                        None if Instant::now() < deadline => Some(Duration::from_millis(100)),
                        None => None,
                    };
                    let Some(d) = wait else { break };
                    if since.is_some() {
                        self.events.say(&format!(
                            "fault {}: waiting {} ms for the active CM's startup grace to end",
                            f.index,
                            d.as_millis()
                        ));
                    }
                    self.hold(d);
                }
                self.cluster.signal_server(i, "STOP")?;
                self.events.say(&format!(
                    "fault {}: SIGSTOP server-{i} (pid {}) for {} ms (lease {} ms)",
                    f.index,
                    pid_text(self.cluster.servers[i].pid()),
                    f.hold_ms,
                    self.opts.lease_ms
                ));
                let until = Instant::now() + hold;
                let address = self.cluster.server_addrs[i].clone();
                let mut evicted = None;
                while Instant::now() < until {
                    self.hold((until - Instant::now()).min(Duration::from_millis(100)));
                    if evicted.is_none() {
                        if let Ok(c) = self.observer.config(&self.cluster) {
                            if !c
                                .members
                                .iter()
                                .any(|m| m.address.as_deref() == Some(&address))
                            {
                                evicted = Some(c.term.0);
                                self.events.say(&format!(
                                    "fault {}: server-{i} evicted while stopped (term {})",
                                    f.index, c.term.0
                                ));
                            }
                        }
                    }
                }
                self.cluster.signal_server(i, "CONT")?;
                if evicted.is_some() {
                    self.pauses_evicted += 1;
                }
                self.events.say(&format!(
                    "heal {}: SIGCONT server-{i}{}",
                    f.index,
                    if evicted.is_some() {
                        ""
                    } else {
                        " (it was not evicted while stopped)"
                    }
                ));
            }
            FaultKind::KillActiveCm => {
                let deadline = Instant::now() + Duration::from_secs(10);
                let (j, note) = loop {
                    match self.cluster.active_cm() {
                        Ok(Some(j)) => break (j, String::new()),
                        Ok(None) | Err(_) if Instant::now() < deadline => {
                            self.hold(Duration::from_millis(100))
                        }
                        Ok(None) => {
                            break (0, " (no CM held the active lease: killed cm-0)".to_string())
                        }
                        Err(e) => break (0, format!(" (the active CM unknown: {e}: killed cm-0)")),
                    }
                };
                let pid = self.cluster.kill_cm(j);
                self.events.say(&format!(
                    "fault {}: kill -9 the active CM cm-{j} (pid {}){note}; restart in {} ms",
                    f.index,
                    pid_text(pid),
                    f.hold_ms
                ));
                self.hold(hold);
                let pid = self.cluster.start_cm(j, self.t_s())?;
                self.events
                    .say(&format!("heal {}: cm-{j} restarted (pid {pid})", f.index));
            }
            FaultKind::PartitionServer
            | FaultKind::IsolateFromCms
            | FaultKind::SplitMinority
            | FaultKind::OneWayCut
            | FaultKind::SlowLink => self.inject_network(f)?,
            FaultKind::ClockJump => self.inject_clock_jump(f),
            FaultKind::Migrate => self.inject_migration(f)?,
            FaultKind::KillClient => {
                let c = f.client.expect("kill-client names its client");
                let fleet = self.fleet.as_mut().expect("the clients run during faults");
                let (name, client, pid) = fleet.kill(c);
                self.events.say(&format!(
                    "fault {}: kill -9 {name} (client {client}, pid {}); a new client in {} ms",
                    f.index,
                    pid_text(pid),
                    f.hold_ms
                ));
                self.hold(hold);
                let fleet = self.fleet.as_mut().expect("the clients run during faults");
                let (client, pid) = fleet.restart(c)?;
                self.events.say(&format!(
                    "heal {}: {name} started again as client {client} (pid {pid})",
                    f.index
                ));
            }
            FaultKind::PowerCut => {
                let killed = self.cluster.power_cut();
                self.events.say(&format!(
                    "fault {}: power cut: {} CMs and servers killed at once (etcd and pools kept); cold start in {} ms",
                    f.index,
                    killed.len(),
                    f.hold_ms
                ));
                self.hold(hold);
                self.cluster.start_all(self.t_s())?;
                self.events.say(&format!(
                    "heal {}: every CM and server restarted (cold start)",
                    f.index
                ));
            }
        }
        Ok(())
    }
}

impl Run {
    /// The configuration now and server `i`'s node in it, or why not.
    fn member(&mut self, i: usize) -> Result<(Arc<Config>, rowankv_types::NodeId), String> {
        let config = self.observer.config(&self.cluster)?;
        let address = &self.cluster.server_addrs[i];
        let node = config
            .members
            .iter()
            .find(|m| m.address.as_deref() == Some(address.as_str()))
            .ok_or_else(|| format!("server-{i} is not a member of {}", config.term))?
            .node;
        Ok((config, node))
    }

    /// Step server `i`'s calendar clock by `step_ms` (`rowankv clock-step`'s
    /// call); the offset after the step, or why not.
    fn clock_step(&mut self, i: usize, step_ms: i64) -> Result<i64, String> {
        let (_, node) = self.member(i)?;
        rowankv_deploy::admin::clock_step(
            self.cluster.layout.cluster_id,
            &self.cluster.secret,
            &self.cluster.cm_addrs,
            node,
            step_ms,
            Duration::from_secs(5),
        )
        .map_err(|e| e.to_string())
    }

    /// A server's calendar clock stepped, held, stepped back. Only expiry
    /// reads it (a third of the clients' PUTs carry an expiry time a day
    /// ahead, far past any step): nothing may change. A step that cannot be
    /// made is a violation (the cluster is whole before every fault).
    fn inject_clock_jump(&mut self, f: &Fault) {
        let i = f.server.expect("a clock jump names its server");
        match self.clock_step(i, f.jump_ms) {
            Ok(offset) => self.events.say(&format!(
                "fault {}: server-{i}'s calendar clock stepped by {:+} ms (now {offset:+} ms from the host's) for {} ms",
                f.index, f.jump_ms, f.hold_ms
            )),
            Err(why) => {
                let v = format!("fault {}: stepping server-{i}'s clock failed: {why}", f.index);
                self.events.say(&format!("VIOLATION {v}"));
                self.violations.push(v);
                return;
            }
        }
        self.hold(Duration::from_millis(f.hold_ms));
        match self.clock_step(i, -f.jump_ms) {
            Ok(offset) => self.events.say(&format!(
                "heal {}: server-{i}'s calendar clock stepped back ({offset:+} ms from the host's)",
                f.index
            )),
            Err(why) => {
                let v = format!(
                    "heal {}: stepping server-{i}'s clock back failed: {why}",
                    f.index
                );
                self.events.say(&format!("VIOLATION {v}"));
                self.violations.push(v);
            }
        }
    }

    /// `migrate`: `rowankv reshard`'s call moves a shard (drawn by the
    /// fault's index among those the named server holds no replica of) to
    /// that server. Interrupted, the target is killed right after the move
    /// is listed and restarted after the hold time; else the move must end
    /// within `MIGRATION_PATIENCE` (a migration that never ends is a
    /// violation). A refusal is the CM's answer, not a violation; the
    /// history check judges what the clients saw either way.
    fn inject_migration(&mut self, f: &Fault) -> Result<(), ChaosError> {
        const MIGRATION_PATIENCE: Duration = Duration::from_secs(30);
        let i = f.server.expect("a migration names its target");
        let (config, to) = match self.member(i) {
            Ok(m) => m,
            Err(why) => {
                self.migrations.refused += 1;
                self.events
                    .say(&format!("fault {}: no migration: {why}", f.index));
                return Ok(());
            }
        };
        let candidates: Vec<_> = config
            .shards
            .iter()
            .filter(|s| !s.is_replica(to))
            .map(|s| s.shard)
            .collect();
        if candidates.is_empty() {
            self.migrations.refused += 1;
            self.events.say(&format!(
                "fault {}: server-{i} holds a replica of every shard: no migration",
                f.index
            ));
            return Ok(());
        }
        let shard = candidates[f.index % candidates.len()];
        let listed = match rowankv_deploy::client::reshard(
            self.cluster.layout.cluster_id,
            &self.cluster.secret,
            &self.cluster.cm_addrs,
            shard,
            to,
            false,
            Duration::from_secs(5),
        ) {
            Ok((listed, _)) => listed,
            Err(why) => {
                self.migrations.refused += 1;
                self.events.say(&format!(
                    "fault {}: moving {shard} to server-{i} ({to}) refused: {why}",
                    f.index
                ));
                return Ok(());
            }
        };
        self.migrations.started += 1;
        self.events.say(&format!(
            "fault {}: {shard} migrating to server-{i} ({to}), listed at {listed}{}",
            f.index,
            if f.interrupt {
                format!("; kill -9 server-{i} now, restart in {} ms", f.hold_ms)
            } else {
                String::new()
            }
        ));
        if f.interrupt {
            let pid = self.cluster.kill_server(i);
            self.events.say(&format!(
                "fault {}: kill -9 server-{i} (pid {}), the migration's target",
                f.index,
                pid_text(pid)
            ));
            self.hold(Duration::from_millis(f.hold_ms));
            let pid = self.cluster.start_server(i, self.t_s())?;
            self.events.say(&format!(
                "heal {}: server-{i} restarted on its pool (pid {pid})",
                f.index
            ));
        }
        let deadline = Instant::now() + MIGRATION_PATIENCE;
        loop {
            if let Ok(c) = self.observer.config(&self.cluster) {
                if c.term > listed && c.migration(shard).is_none() {
                    let primary = c.shard(shard).map(|s| s.primary);
                    if primary == Some(to) {
                        self.migrations.finished += 1;
                        self.events.say(&format!(
                            "heal {}: {shard} moved to server-{i} ({to}) at {}",
                            f.index, c.term
                        ));
                    } else {
                        self.migrations.rolled_back += 1;
                        self.events.say(&format!(
                            "heal {}: the migration of {shard} rolled back at {} (primary {})",
                            f.index,
                            c.term,
                            primary.map_or("none".to_string(), |p| p.to_string())
                        ));
                    }
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                let v = format!(
                    "fault {}: the migration of {shard} to {to} (listed at {listed}) did not end within {MIGRATION_PATIENCE:?}",
                    f.index
                );
                self.events.say(&format!("VIOLATION {v}"));
                self.violations.push(v);
                return Ok(());
            }
            self.hold(Duration::from_millis(100));
        }
    }

    /// A partition or a slow link, held for the fault's time, then healed.
    fn inject_network(&mut self, f: &Fault) -> Result<(), ChaosError> {
        let net = self
            .cluster
            .net
            .as_ref()
            .expect("network faults are planned only for a run with its namespaces");
        let i = f.server.expect("a network fault names its server");
        let servers: Vec<Space> = net.servers.clone();
        let cms: Vec<Space> = net.cms.clone();
        let n = servers.len();
        let target = &servers[i];
        let others: Vec<&Space> = (0..n).filter(|&k| k != i).map(|k| &servers[k]).collect();
        let all_cms: Vec<&Space> = cms.iter().collect();
        let what = match f.kind {
            FaultKind::PartitionServer => {
                Net::cut(&[target], &others)?;
                format!("server-{i} cut from the other servers")
            }
            FaultKind::IsolateFromCms => {
                Net::cut(&[target], &all_cms)?;
                format!("server-{i} cut from the CMs")
            }
            FaultKind::SplitMinority => {
                let i2 = (i + 1) % n;
                let c = i % cms.len();
                let minority = [target, &servers[i2], &cms[c]];
                let majority: Vec<&Space> = (0..n)
                    .filter(|&k| k != i && k != i2)
                    .map(|k| &servers[k])
                    .chain((0..cms.len()).filter(|&k| k != c).map(|k| &cms[k]))
                    .collect();
                Net::cut(&minority, &majority)?;
                format!("split: server-{i}, server-{i2} and cm-{c} from the rest")
            }
            FaultKind::OneWayCut => {
                let to: Vec<String> = others
                    .iter()
                    .chain(&all_cms)
                    .map(|s| s.ip.clone())
                    .collect();
                Net::block(target, &[], &to)?;
                format!("server-{i}'s packets to the other servers and the CMs dropped")
            }
            FaultKind::SlowLink => {
                net.slow(i)?;
                format!("server-{i}'s link slowed to {} both ways", net::SLOW_RATE)
            }
            k => unreachable!("{k} is not a network fault"),
        };
        self.events.say(&format!(
            "fault {}: {what} for {} ms (lease {} ms)",
            f.index, f.hold_ms, self.opts.lease_ms
        ));
        self.hold(Duration::from_millis(f.hold_ms));
        let net = self.cluster.net.as_ref().expect("checked above");
        if f.kind == FaultKind::SlowLink {
            net.heal_slow(i)?;
        } else {
            net.heal_partitions()?;
        }
        self.events
            .say(&format!("heal {}: the network is whole again", f.index));
        Ok(())
    }
}

impl Run {
    /// Before a fault that cuts server `i` off: start a one-key reader on a
    /// key whose shard `i` leads now (if it leads any), and give it time to
    /// connect and read. The readers started with the load were placed on
    /// the primaries of then; failovers, migrations and cold starts move
    /// shards since, and a server cut off must have a reader of its own to
    /// be caught answering after its lease (the planted bug of
    /// `--planted serve-without-lease`). Returns the readers started.
    /// `i` if it leads a shard now, else the next server (in index order,
    /// wrapping) that does; `i` if none does or there is no configuration.
    fn leading_server_from(&mut self, i: usize) -> usize {
        let Ok(config) = self.observer.config(&self.cluster) else {
            return i;
        };
        let n = self.cluster.server_addrs.len();
        (0..n)
            .map(|k| (i + k) % n)
            .find(|&s| {
                let a = &self.cluster.server_addrs[s];
                config
                    .members
                    .iter()
                    .find(|m| m.address.as_deref() == Some(a.as_str()))
                    .is_some_and(|m| config.primary_shards(m.node).next().is_some())
            })
            .unwrap_or(i)
    }

    fn add_reader_of(
        &mut self,
        i: usize,
        keys: &[String],
        next: &mut u32,
        fault: usize,
    ) -> Result<usize, ChaosError> {
        const READER_WARMUP: Duration = Duration::from_millis(500);
        let Ok(config) = self.observer.config(&self.cluster) else {
            return Ok(0);
        };
        let Some((_, key)) = reader_keys(&config, &self.cluster.server_addrs, keys)
            .into_iter()
            .find(|(s, _)| *s == i)
        else {
            return Ok(0);
        };
        let Some(fleet) = self.fleet.as_mut() else {
            return Ok(0);
        };
        fleet.add(*next, clients::Role::Reader(key.clone()))?;
        *next += 1;
        self.events.say(&format!(
            "fault {fault}: a one-key reader on {key} (led by server-{i} at {})",
            config.term
        ));
        self.hold(READER_WARMUP);
        Ok(1)
    }
}

/// For each server (index into `addrs`) that leads a shard in `config`, the
/// first of `keys` in such a shard.
fn reader_keys(config: &Config, addrs: &[String], keys: &[String]) -> Vec<(usize, String)> {
    addrs
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let node = config
                .members
                .iter()
                .find(|m| m.address.as_deref() == Some(a.as_str()))?
                .node;
            let key = keys
                .iter()
                .find(|k| config.shard_for_key(k.as_bytes()).primary == node)?;
            Some((i, key.clone()))
        })
        .collect()
}

fn pid_text(pid: Option<u32>) -> String {
    pid.map_or_else(|| "not running".to_string(), |p| p.to_string())
}

/// Watches etcd for newly committed terms, noting when each was first seen on
/// the run's clock. A term is committed no later than it is seen, so
/// "committed at" this moment is safe for the stale-configuration check: it can
/// only miss a stale answer, never invent one.
///
/// It also notes when the holder of the active CM lease changes
/// (`active_since`: when the current holder was first seen; `None` while no CM
/// holds it).
fn watch_commits(
    store: rowankv_cm::EtcdStore,
    load: Arc<Load>,
    stop: Arc<AtomicBool>,
    active_since: Arc<Mutex<Option<Instant>>>,
) -> Vec<ConfigCommit> {
    let mut commits: Vec<ConfigCommit> = Vec::new();
    let mut holder: Option<Vec<u8>> = None;
    while !stop.load(Ordering::Acquire) {
        if let Ok(now) = cluster::active_holder(&store) {
            if now != holder {
                *active_since.lock() = now.as_ref().map(|_| Instant::now());
                holder = now;
            }
        }
        if let Ok(term) = cluster::committed_term(&store) {
            if term > commits.last().map_or(0, |c| c.term) {
                commits.push(ConfigCommit {
                    term,
                    at: load.now_ns(),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    commits
}

/// A run: start the cluster, load it, inject the schedule's faults, heal, read
/// back, check. Writes `history.jsonl`, `faults.log`, `summary.json` and
/// `logs/` into the run's directory. `Err` only when the run could not be
/// carried out; violations are in the summary.
pub fn run(opts: &ChaosOptions) -> Result<Summary, ChaosError> {
    opts.check()?;
    match std::process::Command::new(&opts.etcd)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .status()
    {
        Ok(s) if s.success() => {}
        other => {
            return Err(ChaosError::Etcd(format!(
                "{} --version failed ({other:?}): a chaos run needs a real etcd \
                 (Debian: apt-get install etcd-server; or --etcd PATH)",
                opts.etcd.display()
            )))
        }
    }
    std::fs::create_dir_all(&opts.dir).map_err(|source| ChaosError::Io {
        what: format!("creating {}", opts.dir.display()),
        source,
    })?;
    let dir = opts.dir.canonicalize().map_err(|source| ChaosError::Io {
        what: format!("resolving {}", opts.dir.display()),
        source,
    })?;
    let start = Instant::now();
    let faults_file = File::create(dir.join("faults.log")).map_err(|source| ChaosError::Io {
        what: "creating faults.log".into(),
        source,
    })?;
    let events = Arc::new(Events {
        file: Mutex::new(BufWriter::new(faults_file)),
        start,
    });
    let schedule = schedule::generate(opts.seed, opts.shape());
    events.say(&format!(
        "chaos run: seed {}, {} s, {} servers (RF 3), 2 CMs on etcd, {} client threads, {} keys (Zipf {}), lease {} ms; {} faults planned:",
        opts.seed,
        opts.seconds,
        opts.servers,
        opts.clients,
        opts.keys,
        opts.zipf,
        opts.lease_ms,
        schedule.len()
    ));
    for f in &schedule {
        events.say(&format!("  planned {f}"));
    }
    events.say(&format!("replay: {}", opts.replay_command()));
    let cluster_id = 0x0c4a_0500_0000_0000 | (opts.seed & 0xffff_ffff);
    let cluster = Cluster::prepare(Layout {
        dir: dir.clone(),
        bin: opts.bin.clone(),
        etcd: opts.etcd.clone(),
        servers: opts.servers,
        cms: 2,
        lease_ms: opts.lease_ms,
        cluster_id,
        netns: opts.netns,
        planted_serve_without_lease: opts.planted_serve_without_lease,
    })?;
    if let Some(net) = &cluster.net {
        events.say(&net.describe());
    }
    events.say(&format!("etcd up at {}", cluster.etcd_endpoint));
    let mut run = Run {
        opts: opts.clone(),
        cluster,
        events: events.clone(),
        observer: Observer { attached: None },
        start,
        violations: Vec::new(),
        crashes_reported: 0,
        active_since: Arc::new(Mutex::new(None)),
        pauses_evicted: 0,
        migrations: MigrationCounts::default(),
        fleet: None,
    };
    let t = run.t_s();
    run.cluster.start_all(t)?;
    let recover = Duration::from_secs_f64(opts.recover_timeout_s);
    let term = run
        .wait_healthy(recover.max(Duration::from_secs(60)))
        .map_err(|why| {
            ChaosError::Cluster(format!(
                "the cluster did not come up: {why}; crashed: {:?} (logs in {}/logs)",
                run.cluster.crashes,
                dir.display()
            ))
        })?;
    events.say(&format!(
        "cluster up: {} servers, term {term}; load starts",
        opts.servers
    ));

    let load = Arc::new(Load {
        cluster_id,
        secret: run.cluster.secret.clone(),
        cms: run.cluster.cm_addrs.clone(),
        start_monotonic_ns: clients::monotonic_ns_of(start),
        keys: fleet::key_names(opts.keys),
        zipf_s: opts.zipf,
        seed: opts.seed,
        stop: AtomicBool::new(false),
    });
    let watcher_stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (store, load, stop) = (run.cluster.store()?, load.clone(), watcher_stop.clone());
        let active_since = run.active_since.clone();
        std::thread::Builder::new()
            .name("chaos-commits".into())
            .spawn(move || watch_commits(store, load, stop, active_since))
            .map_err(|source| ChaosError::Io {
                what: "starting a thread".into(),
                source,
            })?
    };
    let load_start = Instant::now();
    let load_start_ns = load.now_ns();
    // One one-key reader per server, on a key whose shard it leads now.
    let readers = run
        .observer
        .config(&run.cluster)
        .map(|c| reader_keys(&c, &run.cluster.server_addrs, &load.keys))
        .unwrap_or_default();
    events.say(&format!(
        "one-key readers on {}",
        readers
            .iter()
            .map(|(i, k)| format!("{k} (led by server-{i})"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut fleet = Fleet::new(&opts.bin, &dir, load.clone(), dir.join("secret"))?;
    for c in 0..opts.clients {
        fleet.add(c as u32 + 1, clients::Role::Mixed)?;
    }
    for (r, (_, key)) in readers.iter().enumerate() {
        fleet.add(
            (opts.clients + 1 + r) as u32,
            clients::Role::Reader(key.clone()),
        )?;
    }
    events.say(&format!(
        "{} client processes started (journals in clients/)",
        fleet.lives()
    ));
    run.fleet = Some(fleet);

    let mut injected = 0;
    let mut readers_added = 0usize;
    let mut next_reader = (opts.clients + 1 + readers.len()) as u32;
    let mut excused: BTreeSet<usize> = BTreeSet::new();
    let mut by_kind: BTreeMap<String, u64> = FaultKind::planned(opts.netns)
        .iter()
        .map(|k| (k.name().to_string(), 0))
        .collect();
    for f in &schedule {
        let due = load_start + Duration::from_millis(f.at_ms);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            run.hold(d);
        }
        // One fault at a time: the next waits for the cluster to be whole.
        if let Err(why) = run.wait_healthy_excusing(recover, &excused) {
            let v = format!(
                "before fault {}: not back to full replication within {:.0} s: {why}",
                f.index, opts.recover_timeout_s
            );
            events.say(&format!("VIOLATION {v}"));
            run.violations.push(v);
            // Servers that did not rejoin are reported once; if the shards are
            // whole without them, the faults go on (more of the run is
            // checked), else the faults end here.
            let missing = run.missing_members();
            if missing.is_empty() || missing.is_subset(&excused) {
                break;
            }
            excused.extend(missing);
            match run.wait_healthy_excusing(recover, &excused) {
                Ok(term) => events.say(&format!(
                    "the shards are whole at term {term} without server(s) {excused:?}: the faults go on"
                )),
                Err(why) => {
                    events.say(&format!(
                        "not whole even without server(s) {excused:?} ({why}): the faults end"
                    ));
                    break;
                }
            }
        }
        let mut f = *f;
        if f.kind.takes_the_lease() {
            if let Some(i) = f.server {
                let j = run.leading_server_from(i);
                if j != i {
                    events.say(&format!(
                        "fault {}: server-{i} leads no shard now: server-{j} instead",
                        f.index
                    ));
                }
                f.server = Some(j);
            }
        }
        if f.kind.cuts_a_server_off() {
            if let Some(i) = f.server {
                readers_added += run.add_reader_of(i, &load.keys, &mut next_reader, f.index)?;
            }
        }
        let f = &f;
        run.inject(f)?;
        injected += 1;
        *by_kind.entry(f.kind.name().to_string()).or_default() += 1;
    }
    let end = load_start + Duration::from_secs_f64(opts.seconds);
    if let Some(d) = end.checked_duration_since(Instant::now()) {
        run.hold(d);
    }
    let mut fleet = run.fleet.take().expect("the fleet was started");
    fleet.stop();
    let load_s = load_start.elapsed().as_secs_f64();
    let (mut ops, cut_by_kills) = fleet.history();
    run.violations.append(&mut fleet.violations);
    events.say(&format!(
        "load stopped: {} operations in {load_s:.1} s by {} client processes ({cut_by_kills} cut short by kill-client); healing",
        ops.len(),
        fleet.lives()
    ));
    load.stop.store(true, Ordering::Release);

    // Heal: continue what is stopped, start what is down, wait for full
    // replication.
    let t = run.t_s();
    run.cluster.start_all(t)?;
    match run.wait_healthy(recover) {
        Ok(term) => events.say(&format!(
            "healed: full replication at term {term}; reading every key back"
        )),
        Err(why) => {
            let v = format!(
                "after healing: not back to full replication within {:.0} s: {why}",
                opts.recover_timeout_s
            );
            events.say(&format!("VIOLATION {v}"));
            run.violations.push(v);
        }
    }
    let operations = ops.len() as u64;
    let unread = clients::read_back(&load, 0, 20, &mut ops);
    for key in &unread {
        run.violations.push(format!(
            "{key} could not be read back after healing (20 attempts)"
        ));
    }
    watcher_stop.store(true, Ordering::Release);
    let commits = watcher.join().expect("the commit watcher does not panic");

    ops.sort_by_key(|o| (o.call, o.ret));
    let history = History::from(ops);
    events.say(&format!(
        "checking {} operations ({} commits seen in etcd)",
        history.len(),
        commits.len()
    ));
    let report = check_with_budget(&history, &commits, opts.check_budget);
    for v in &report.violations {
        run.violations.push(v.to_string());
    }
    let path = dir.join("history.jsonl");
    let mut w = BufWriter::new(File::create(&path).map_err(|source| ChaosError::Io {
        what: format!("creating {}", path.display()),
        source,
    })?);
    history
        .write_jsonl(&mut w)
        .and_then(|()| w.flush())
        .map_err(|source| ChaosError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;

    let load_ops = history
        .iter()
        .filter(|o| !o.final_read && o.call >= load_start_ns);
    let mut s = Summary {
        seed: opts.seed,
        seconds: opts.seconds,
        servers: opts.servers,
        clients: opts.clients,
        readers: readers.len() + readers_added,
        client_processes: fleet.lives(),
        cut_by_kills,
        net: if opts.netns { "netns" } else { "loopback" }.to_string(),
        planted: opts
            .planted_serve_without_lease
            .then(|| "serve-without-lease".to_string()),
        keys: opts.keys,
        lease_ms: opts.lease_ms,
        load_s,
        operations,
        faults_planned: schedule.len(),
        faults_injected: injected,
        faults_by_kind: by_kind,
        pauses_evicted: run.pauses_evicted,
        migrations: run.migrations,
        commits_observed: commits.len(),
        first_term: commits.first().map_or(0, |c| c.term),
        last_term: commits.last().map_or(0, |c| c.term),
        inconclusive_keys: report.count(ViolationKind::Inconclusive),
        checker: format!(
            "{} ops on {} keys checked: {} violation(s)",
            report.ops_checked,
            report.keys,
            report.violations.len()
        ),
        replay: opts.replay_command(),
        ..Summary::default()
    };
    for o in load_ops {
        match (o.op, o.status) {
            (OpKind::Put | OpKind::Del, Status::Ok) => s.acknowledged_writes += 1,
            (OpKind::Get, Status::Ok) => s.reads_ok += 1,
            (_, Status::Unknown) => s.unknown += 1,
            (_, Status::Fail) => s.failed += 1,
        }
    }
    s.final_reads = history.iter().filter(|o| o.final_read).count() as u64;
    if injected < schedule.len() {
        s.violations.push(format!(
            "{injected} of {} scheduled faults injected",
            schedule.len()
        ));
    }
    s.violations.append(&mut run.violations);
    // Reaped last, just before everything is stopped on purpose.
    run.watch();
    for (name, status) in &run.cluster.crashes {
        s.violations
            .push(format!("{name} exited without being killed: {status}"));
    }
    run.cluster.shut_down();
    s.elapsed_s = start.elapsed().as_secs_f64();
    let path = dir.join("summary.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&s).expect("a summary serializes") + "\n",
    )
    .map_err(|source| ChaosError::Io {
        what: format!("writing {}", path.display()),
        source,
    })?;
    events.say(&format!(
        "done: {} operations, {} acknowledged writes, {} unknown, {} faults ({}), {} violation(s)",
        s.operations,
        s.acknowledged_writes,
        s.unknown,
        s.faults_injected,
        s.faults_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        s.violations.len()
    ));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &std::path::Path) -> ChaosOptions {
        // Any existing file stands for the binary here.
        let bin = std::env::current_exe().unwrap();
        ChaosOptions::new(60.0, 1, dir.join("run"), bin)
    }

    type Change = Box<dyn Fn(&mut ChaosOptions)>;

    #[test]
    fn options_out_of_range_are_refused_with_the_option_named() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(opts(tmp.path()).check().is_ok());
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|o| o.seconds = 0.0), "--seconds"),
            (Box::new(|o| o.seconds = f64::NAN), "--seconds"),
            (Box::new(|o| o.servers = 2), "--servers 2"),
            (Box::new(|o| o.servers = 17), "--servers 17"),
            (Box::new(|o| o.clients = 0), "--clients 0"),
            (Box::new(|o| o.keys = 0), "--keys 0"),
            (Box::new(|o| o.zipf = 0.0), "--zipf 0"),
            (Box::new(|o| o.lease_ms = 99), "--lease-ms 99"),
            (
                Box::new(|o| o.recover_timeout_s = 0.5),
                "--recover-timeout-s",
            ),
            (Box::new(|o| o.check_budget = 0), "--check-budget"),
            (
                Box::new(|o| o.bin = "/nonexistent/rowankv".into()),
                "does not exist",
            ),
        ];
        for (change, named) in cases {
            let mut o = opts(tmp.path());
            change(&mut o);
            let e = o.check().unwrap_err().to_string();
            assert!(e.contains(named), "{e:?} does not name {named:?}");
        }
        let mut o = opts(tmp.path());
        std::fs::create_dir_all(&o.dir).unwrap();
        assert!(o.check().is_ok(), "an empty directory is fine");
        std::fs::write(o.dir.join("history.jsonl"), "").unwrap();
        assert!(o.check().unwrap_err().to_string().contains("is not empty"));
        o.dir = o.dir.join("history.jsonl");
        assert!(o
            .check()
            .unwrap_err()
            .to_string()
            .contains("is not a directory"));
    }

    #[test]
    fn the_replay_command_repeats_every_option_of_the_schedule() {
        let tmp = tempfile::tempdir().unwrap();
        let mut o = opts(tmp.path());
        o.seed = 42;
        o.servers = 4;
        o.lease_ms = 700;
        let r = o.replay_command();
        for part in [
            "--seconds 60",
            "--seed 42",
            "--servers 4",
            "--lease-ms 700",
            "--clients 8",
        ] {
            assert!(r.contains(part), "{r} lacks {part}");
        }
        assert!(r.ends_with("run-replay"), "{r}: a new directory");
    }
}
