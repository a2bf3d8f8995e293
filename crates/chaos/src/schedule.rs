//! The fault schedule of a chaos run: a list of faults drawn from one seed.
//!
//! The schedule is a pure function of the seed and the run's shape (its
//! length, its server count, the servers' lease): the same options always give
//! the same faults, in the same order, with the same targets and hold times,
//! planned at the same offsets. What a real cluster does in between is not
//! deterministic (the kernel schedules real processes), so a replay repeats the
//! faults, not the history.
//!
//! Coverage is built in: the first faults are every planned kind once, in an
//! order drawn from the seed, then (if the run holds at least twice as many
//! faults as kinds) every kind once more; the rest are drawn with weights. A
//! run of `seconds` plans one fault per [`FAULT_PERIOD_MS`], and never fewer
//! than one of each kind. Network faults are planned only for a run with its
//! network namespaces (`crate::net`).

use std::fmt;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One fault is planned per this much of the run.
pub const FAULT_PERIOD_MS: u64 = 5_000;

/// The most faults one schedule holds (a bound on the run, whatever its length).
pub const FAULTS_MAX: usize = 10_000;

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// `kill -9` of one server, restarted on its pool after the hold time (it
    /// must rejoin: as a member if its lease had not run out, else as a new
    /// joining backup).
    KillServer,
    /// `kill -9` of the CM that holds the active lease in etcd, restarted after
    /// the hold time; the standby takes over meanwhile.
    KillActiveCm,
    /// SIGSTOP of one server for longer than its lease, then SIGCONT: it is
    /// evicted while stopped and must join again.
    PauseServer,
    /// Every CM and server killed at once (etcd and the pools kept), everything
    /// restarted after the hold time: a cold start.
    PowerCut,
    /// One server cut from the other servers, both ways (the CMs and the
    /// clients still reach it). Network namespaces only, as the four below.
    PartitionServer,
    /// One server cut from both CMs, both ways: it cannot renew its lease
    /// (the clients still reach it, and must get no answer from it once its
    /// lease ran out).
    IsolateFromCms,
    /// Two servers and one CM cut from the other servers and CM, both ways.
    SplitMinority,
    /// One server's packets to every other server and CM dropped; what they
    /// send it still arrives.
    OneWayCut,
    /// One server's link slowed to `crate::net::SLOW_RATE` both ways.
    SlowLink,
    /// One server's calendar clock stepped by [`Fault::jump_ms`]
    /// (`rowankv clock-step`: what expiry times are measured against, never
    /// its lease clock), stepped back after the hold time.
    ClockJump,
    /// `kill -9` of one client process (of the mixed clients, not a reader),
    /// started again as a new client after the hold time. Its operation in
    /// flight stays of unknown outcome; the servers see a connection die
    /// mid-request.
    KillClient,
    /// Dynamic resharding: `rowankv reshard` moves a shard to the named
    /// server (one holding none of its replicas) while the load runs; with
    /// [`Fault::interrupt`] the target is killed with `kill -9` right after
    /// the move is listed and restarted after the hold time (the migration
    /// rolls back), else the migration must finish.
    Migrate,
}

impl FaultKind {
    /// Whether the fault may leave a server up but unable to renew its
    /// lease (stopped, or cut from the CMs, or on the side of a split
    /// without them), so that it must stop answering once its lease ends.
    pub fn cuts_a_server_off(self) -> bool {
        matches!(
            self,
            FaultKind::PauseServer
                | FaultKind::IsolateFromCms
                | FaultKind::SplitMinority
                | FaultKind::OneWayCut
        )
    }

    /// Whether the fault surely takes its one server's lease away (stopped,
    /// or cut from every CM): such a fault is aimed at a server that leads
    /// a shard when it is injected (the scheduled one, or the next that
    /// does), so that answering after the lease can be caught.
    pub fn takes_the_lease(self) -> bool {
        matches!(
            self,
            FaultKind::PauseServer | FaultKind::IsolateFromCms | FaultKind::OneWayCut
        )
    }
}

impl FaultKind {
    /// Every kind, in the order of the summary.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::KillServer,
        FaultKind::KillActiveCm,
        FaultKind::PauseServer,
        FaultKind::PowerCut,
        FaultKind::PartitionServer,
        FaultKind::IsolateFromCms,
        FaultKind::SplitMinority,
        FaultKind::OneWayCut,
        FaultKind::SlowLink,
        FaultKind::ClockJump,
        FaultKind::KillClient,
        FaultKind::Migrate,
    ];

    /// Whether it needs the run's network namespaces.
    pub fn network(self) -> bool {
        !matches!(
            self,
            FaultKind::KillServer
                | FaultKind::KillActiveCm
                | FaultKind::PauseServer
                | FaultKind::PowerCut
                | FaultKind::ClockJump
                | FaultKind::KillClient
                | FaultKind::Migrate
        )
    }

    /// The kinds a run plans: with `network`, all of them.
    pub fn planned(network: bool) -> Vec<FaultKind> {
        FaultKind::ALL
            .into_iter()
            .filter(|k| network || !k.network())
            .collect()
    }

    /// The name in `faults.log` and `summary.json`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillServer => "kill-server",
            FaultKind::KillActiveCm => "kill-active-cm",
            FaultKind::PauseServer => "pause-server",
            FaultKind::PowerCut => "power-cut",
            FaultKind::PartitionServer => "partition-server",
            FaultKind::IsolateFromCms => "isolate-from-cms",
            FaultKind::SplitMinority => "split-minority",
            FaultKind::OneWayCut => "one-way-cut",
            FaultKind::SlowLink => "slow-link",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::KillClient => "kill-client",
            FaultKind::Migrate => "migrate",
        }
    }

    /// Relative weight among the faults drawn after the first of each kind.
    fn weight(self) -> u32 {
        match self {
            FaultKind::KillServer => 4,
            FaultKind::KillActiveCm => 2,
            FaultKind::PauseServer => 3,
            FaultKind::PowerCut => 1,
            FaultKind::PartitionServer => 2,
            FaultKind::IsolateFromCms => 2,
            FaultKind::SplitMinority => 2,
            FaultKind::OneWayCut => 2,
            FaultKind::SlowLink => 2,
            FaultKind::ClockJump => 1,
            FaultKind::KillClient => 2,
            FaultKind::Migrate => 3,
        }
    }

    /// Whether it targets one server (the split: the first of the two
    /// servers of its minority, the next one being the second).
    pub fn targets_a_server(self) -> bool {
        !matches!(
            self,
            FaultKind::KillActiveCm | FaultKind::PowerCut | FaultKind::KillClient
        )
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One planned fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Its position in the schedule, from 0.
    pub index: usize,
    /// When it is due, from the start of the load (it is injected at this
    /// offset or, if the cluster is still recovering from the previous fault,
    /// as soon as it is back to full replication).
    pub at_ms: u64,
    pub kind: FaultKind,
    /// The server (index among the run's servers) for the kinds that target one.
    pub server: Option<usize>,
    /// The client (index among the run's mixed clients) of `kill-client`.
    pub client: Option<usize>,
    /// How long the fault lasts before it is healed (restart, SIGCONT).
    pub hold_ms: u64,
    /// A clock jump's step (negative: back); 0 for the other kinds.
    pub jump_ms: i64,
    /// `migrate`: the target is killed right after the move is listed (the
    /// migration is interrupted); false for the other kinds.
    pub interrupt: bool,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.index, self.kind)?;
        if let Some(s) = self.server {
            write!(f, " server-{s}")?;
        }
        if let Some(c) = self.client {
            write!(f, " client-{}", c + 1)?;
        }
        if self.jump_ms != 0 {
            write!(f, " by {:+} ms", self.jump_ms)?;
        }
        if self.interrupt {
            write!(f, " (target killed midway)")?;
        }
        write!(f, " for {} ms (due at {} ms)", self.hold_ms, self.at_ms)
    }
}

/// The shape of a run, which with the seed fixes its schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleShape {
    /// Planned length of the load.
    pub seconds_ms: u64,
    /// Servers of the cluster (targets are drawn among them).
    pub servers: usize,
    /// The servers' lease: pauses last longer, kills last from a fraction of
    /// it (restarted within it) to several (failed over first).
    pub lease_ms: u64,
    /// Whether network faults are planned (the run has its namespaces).
    pub network: bool,
    /// Mixed clients of the run (`kill-client` targets are drawn among them).
    pub clients: usize,
}

/// The faults of one run, from `seed`.
pub fn generate(seed: u64, shape: ScheduleShape) -> Vec<Fault> {
    assert!(shape.servers > 0, "a schedule needs servers to target");
    assert!(shape.lease_ms > 0, "a lease has a length");
    assert!(shape.clients > 0, "a schedule needs clients to target");
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc4a0_5eed_0000_0000);
    let planned = FaultKind::planned(shape.network);
    let count = ((shape.seconds_ms / FAULT_PERIOD_MS) as usize).clamp(planned.len(), FAULTS_MAX);
    // Every kind once, or twice when the run holds that many faults.
    let rounds = if count >= 2 * planned.len() { 2 } else { 1 };
    let mut kinds = Vec::new();
    for _ in 0..rounds {
        let mut round = planned.clone();
        round.shuffle(&mut rng);
        kinds.extend(round);
    }
    let total_weight: u32 = planned.iter().map(|k| k.weight()).sum();
    while kinds.len() < count {
        let mut pick = rng.gen_range(0..total_weight);
        let kind = planned
            .iter()
            .copied()
            .find(|k| {
                if pick < k.weight() {
                    true
                } else {
                    pick -= k.weight();
                    false
                }
            })
            .expect("the weights cover the range");
        kinds.push(kind);
    }
    // Faults are spread evenly over the run, each a little early or late.
    let slot_ms = (shape.seconds_ms / (count as u64 + 1)).max(1);
    let lease = shape.lease_ms;
    kinds
        .into_iter()
        .enumerate()
        .map(|(index, kind)| {
            let jitter = rng.gen_range(0..=slot_ms / 2);
            let at_ms = slot_ms * (index as u64 + 1) - slot_ms / 4 + jitter;
            let server = kind
                .targets_a_server()
                .then(|| rng.gen_range(0..shape.servers));
            let client = (kind == FaultKind::KillClient).then(|| rng.gen_range(0..shape.clients));
            let hold_ms = match kind {
                // From within the lease (the server is still a member when it
                // comes back) to several leases (it was failed over).
                FaultKind::KillServer => rng.gen_range(lease / 2..=4 * lease),
                FaultKind::KillActiveCm => rng.gen_range(500..=3_000),
                // Always past the lease, so the server is evicted.
                FaultKind::PauseServer => rng.gen_range(2 * lease..=4 * lease),
                FaultKind::PowerCut => rng.gen_range(200..=2_000),
                // From within the lease to several.
                FaultKind::PartitionServer
                | FaultKind::IsolateFromCms
                | FaultKind::SplitMinority
                | FaultKind::OneWayCut => rng.gen_range(lease / 2..=4 * lease),
                FaultKind::SlowLink | FaultKind::ClockJump => rng.gen_range(1_000..=3_000),
                FaultKind::KillClient => rng.gen_range(0..=1_000),
                // An interrupted migration's target is down this long: from
                // within the lease to several.
                FaultKind::Migrate => rng.gen_range(lease / 2..=4 * lease),
            };
            let interrupt = kind == FaultKind::Migrate && rng.gen_bool(0.5);
            // A second to an hour, either way.
            let jump_ms = if kind == FaultKind::ClockJump {
                let magnitude = [1_000, 10_000, 60_000, 3_600_000][rng.gen_range(0..4)];
                if rng.gen_bool(0.5) {
                    magnitude
                } else {
                    -magnitude
                }
            } else {
                0
            };
            Fault {
                index,
                at_ms,
                kind,
                server,
                client,
                hold_ms,
                jump_ms,
                interrupt,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(seconds: u64) -> ScheduleShape {
        ScheduleShape {
            seconds_ms: seconds * 1_000,
            servers: 5,
            lease_ms: 1_000,
            network: true,
            clients: 8,
        }
    }

    #[test]
    fn a_seed_gives_one_schedule_and_other_seeds_others() {
        let a = generate(1, shape(60));
        assert_eq!(a, generate(1, shape(60)), "the same seed, the same faults");
        let distinct = (2..20u64).filter(|&s| generate(s, shape(60)) != a).count();
        assert_eq!(distinct, 18, "every other seed gives another schedule");
    }

    #[test]
    fn every_kind_comes_first_and_a_minute_holds_at_least_eight() {
        for seed in 0..200 {
            for seconds in [1, 20, 60, 300] {
                let s = generate(seed, shape(seconds));
                let n = FaultKind::ALL.len();
                let first: std::collections::BTreeSet<FaultKind> =
                    s.iter().take(n).map(|f| f.kind).collect();
                assert_eq!(first.len(), n, "seed {seed}: {s:?}");
                if s.len() >= 2 * n {
                    let second: std::collections::BTreeSet<FaultKind> =
                        s.iter().skip(n).take(n).map(|f| f.kind).collect();
                    assert_eq!(second.len(), n, "every kind twice: {s:?}");
                }
                let without = generate(
                    seed,
                    ScheduleShape {
                        network: false,
                        ..shape(seconds)
                    },
                );
                assert!(without.iter().all(|f| !f.kind.network()));
                assert!(without.len() >= 4);
                if seconds >= 60 {
                    assert!(
                        s.len() >= 8 * seconds as usize / 60,
                        "seed {seed}: {} faults",
                        s.len()
                    );
                }
            }
        }
    }

    #[test]
    fn targets_hold_times_and_offsets_are_in_range() {
        for seed in 0..200 {
            let s = generate(seed, shape(300));
            let mut last = 0;
            for (i, f) in s.iter().enumerate() {
                assert_eq!(f.index, i);
                assert!(f.at_ms > last, "seed {seed}: offsets increase: {s:?}");
                assert!(f.at_ms < 300_000);
                last = f.at_ms;
                assert_eq!(f.server.is_some(), f.kind.targets_a_server());
                assert_eq!(f.jump_ms != 0, f.kind == FaultKind::ClockJump);
                assert!(f.jump_ms.unsigned_abs() <= 3_600_000);
                assert!(f.server.is_none_or(|t| t < 5));
                assert_eq!(f.client.is_some(), f.kind == FaultKind::KillClient);
                assert!(!f.interrupt || f.kind == FaultKind::Migrate);
                assert!(f.client.is_none_or(|c| c < 8));
                match f.kind {
                    FaultKind::PauseServer => {
                        assert!(f.hold_ms > 1_000, "a pause outlasts the lease")
                    }
                    FaultKind::KillServer => assert!((500..=4_000).contains(&f.hold_ms)),
                    FaultKind::KillActiveCm => assert!((500..=3_000).contains(&f.hold_ms)),
                    FaultKind::PowerCut => assert!((200..=2_000).contains(&f.hold_ms)),
                    FaultKind::SlowLink | FaultKind::ClockJump => {
                        assert!((1_000..=3_000).contains(&f.hold_ms))
                    }
                    FaultKind::KillClient => assert!(f.hold_ms <= 1_000),
                    _ => assert!((500..=4_000).contains(&f.hold_ms)),
                }
            }
        }
    }

    #[test]
    fn faults_after_the_first_of_each_kind_follow_the_weights() {
        let mut drawn = std::collections::BTreeMap::<FaultKind, usize>::new();
        for seed in 0..100 {
            for f in generate(seed, shape(300))
                .iter()
                .skip(2 * FaultKind::ALL.len())
            {
                *drawn.entry(f.kind).or_default() += 1;
            }
        }
        let total: usize = drawn.values().sum();
        assert_eq!(total, 100 * (60 - 2 * FaultKind::ALL.len()));
        let weights: u32 = FaultKind::ALL.iter().map(|k| k.weight()).sum();
        for k in FaultKind::ALL {
            let share = drawn[&k] as f64 / total as f64;
            let want = f64::from(k.weight()) / f64::from(weights);
            assert!(
                (share - want).abs() < 0.03,
                "{k}: {share:.3} of the draws, weight {want}"
            );
        }
    }
}
