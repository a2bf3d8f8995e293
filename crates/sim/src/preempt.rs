//! Preemption inside a role's step: the simulator's clock, and the roles behind
//! cells.
//!
//! On a real server a role's step is not atomic: its thread can be descheduled
//! between any two things it does, while every other role — on other threads,
//! other servers, the CMs — runs on and time passes. Stepping roles one at a
//! time, whole, never shows the races that live there (a write a worker has
//! admitted under one configuration but not yet appended while a failover or a
//! re-replication copy completes around it).
//!
//! The simulator replays such races at points drawn from the seed: a role's
//! read of the clock in the middle of its step may preempt it — the clock
//! runs the other roles for a while (a drawn number of rounds, time moving on
//! before each) before it answers. Every role sits in its own cell
//! ([`Roles`]), so the preemption steps every role not in the middle of a step
//! (the preempted one is locked by its own step) and skips paused servers'.
//!
//! The preemption points are the reads of the roles' clock
//! (`ServerSettings::role_clock`): where a role decides on time — a worker
//! admitting a write or checking its lease before an answer, the CM stamping
//! a grant — which is where the reviewed races live, and never under a lock.
//! The fabric, the store, the engines and the clients read the same time
//! through a view that never preempts ([`SimClock::plain`]): they read it
//! under locks of their own, which a role run by the preemption could need.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rowankv_deploy::Owner;
use rowankv_server::{Step, Task};
use rowankv_types::Clock;

/// A role, in a cell of its own: a preemption steps it while another role's
/// step is under way.
pub type RoleCell = Arc<Mutex<Box<dyn Task>>>;

/// Every role of the simulated cluster, with the owner the simulator pauses,
/// crashes and restarts it by.
#[derive(Default)]
pub struct Roles {
    roles: Vec<(Owner, RoleCell)>,
}

impl Roles {
    pub fn new(tasks: Vec<(Owner, Box<dyn Task>)>) -> Roles {
        Roles {
            roles: tasks
                .into_iter()
                .map(|(o, t)| (o, Arc::new(Mutex::new(t))))
                .collect(),
        }
    }

    pub fn push(&mut self, owner: Owner, task: Box<dyn Task>) {
        self.roles.push((owner, Arc::new(Mutex::new(task))));
    }

    pub fn clear(&mut self) {
        self.roles.clear();
    }

    pub fn len(&self) -> usize {
        self.roles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    pub fn owner(&self, i: usize) -> Owner {
        self.roles[i].0
    }

    pub fn cell(&self, i: usize) -> &RoleCell {
        &self.roles[i].1
    }

    /// Drop the roles at `done` (indices, any order).
    pub fn remove(&mut self, mut done: Vec<usize>) {
        done.sort_unstable();
        done.dedup();
        for i in done.into_iter().rev() {
            self.roles.remove(i);
        }
    }

    /// The cells of every role `runnable` accepts.
    pub fn cells(&self, runnable: impl Fn(Owner) -> bool) -> Vec<RoleCell> {
        self.roles
            .iter()
            .filter(|(o, _)| runnable(*o))
            .map(|(_, c)| c.clone())
            .collect()
    }
}

/// Step a role unless it is in the middle of a step already (`None` then).
pub fn step_cell(cell: &RoleCell, now_ns: u64) -> Option<Step> {
    let mut t = cell.try_lock().ok()?;
    Some(t.step(now_ns))
}

/// When a read of the clock preempts the role reading it, and what runs then.
pub struct Policy {
    /// Each read of the clock by a role mid-step preempts it with this chance.
    pub per_read: f64,
    /// Draws which reads preempt, how long, the order of the roles in each
    /// round and the time each round takes.
    pub rng: ChaCha8Rng,
}

/// A preemption's length in rounds of every other role: mostly short, now
/// and then a few milliseconds — under a third of the simulator's lease, as
/// a short pause is (a longer one could remove servers beyond what a run
/// allows).
fn draw_rounds(rng: &mut ChaCha8Rng, interjected: bool) -> u32 {
    if interjected {
        // Long enough for a configuration to be prepared and committed and a
        // re-replication copy taken while the preempted role waits.
        return rng.gen_range(300..900);
    }
    match rng.gen_range(0..100u32) {
        0..=59 => rng.gen_range(1..30),
        60..=89 => rng.gen_range(30..200),
        _ => rng.gen_range(200..500),
    }
}

/// Something done from outside the cluster — an operator's reconfiguration —
/// while a role of `owner` is preempted mid-step: the next of its reads of the
/// clock that preempts it (each with chance `per_read`) runs `action` first,
/// then the other roles, for long enough to act on it.
pub struct Interjection {
    pub owner: Owner,
    pub per_read: f64,
    pub action: Box<dyn FnOnce() + Send>,
}

/// Time added before each round of a preemption.
const ROUND_NS: std::ops::Range<u64> = 1_000..12_000;

/// The simulator's clock: moved by hand, and able to preempt the role that
/// reads it mid-step.
#[derive(Default)]
pub struct SimClock {
    now_ns: AtomicU64,
    policy: Mutex<Option<Policy>>,
    /// The roles a preemption runs (the simulator's runnable set, refreshed
    /// every round of steps).
    runnable: Mutex<Vec<RoleCell>>,
    /// The owner of the role mid-step (its reads may preempt it).
    in_step: Mutex<Option<Owner>>,
    interjection: Mutex<Option<Interjection>>,
    /// A preemption is running (no read preempts again).
    in_preemption: AtomicBool,
    /// Preemptions that fired, and role steps they ran.
    fired: AtomicU64,
    stepped: AtomicU64,
}

impl std::fmt::Debug for SimClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimClock")
            .field("now_ns", &self.now_ns.load(Ordering::SeqCst))
            .field("fired", &self.fired.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl SimClock {
    pub fn new(start_ns: u64) -> Arc<SimClock> {
        let c = SimClock::default();
        c.now_ns.store(start_ns, Ordering::SeqCst);
        Arc::new(c)
    }

    pub fn advance_ns(&self, delta_ns: u64) {
        self.now_ns.fetch_add(delta_ns, Ordering::SeqCst);
    }

    /// Preempt roles mid-step under `policy` (`None`: never).
    pub fn set_policy(&self, policy: Option<Policy>) {
        *self.policy.lock().expect("the clock's lock") = policy;
    }

    /// Run `i` inside the next preemption of one of its owner's roles.
    pub fn interject(&self, i: Interjection) {
        *self.interjection.lock().expect("the clock's lock") = Some(i);
    }

    /// Take an interjection that has not run off; whether there was one.
    pub fn withdraw(&self) -> bool {
        self.interjection
            .lock()
            .expect("the clock's lock")
            .take()
            .is_some()
    }

    /// The roles a preemption may run.
    pub fn set_runnable(&self, roles: Vec<RoleCell>) {
        *self.runnable.lock().expect("the clock's lock") = roles;
    }

    /// Step a role of `owner`: its reads of this clock may preempt it.
    pub fn step(&self, owner: Owner, cell: &RoleCell, now_ns: u64) -> Option<Step> {
        *self.in_step.lock().expect("the clock's lock") = Some(owner);
        let step = step_cell(cell, now_ns);
        *self.in_step.lock().expect("the clock's lock") = None;
        step
    }

    /// The time, read without ever preempting the reader.
    pub fn time_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    /// A view of this clock that never preempts: for the fabric, the
    /// coordination store, the engines and the clients, which read the clock
    /// under their own locks (a role run by a preemption there would wait
    /// for a lock its preempted holder cannot release).
    pub fn plain(self: &Arc<Self>) -> Arc<dyn Clock> {
        Arc::new(PlainView(self.clone()))
    }

    /// Preemptions fired so far.
    pub fn preemptions(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    /// Role steps run inside preemptions so far.
    pub fn preempted_steps(&self) -> u64 {
        self.stepped.load(Ordering::SeqCst)
    }

    /// Whether this read preempts its reader: if so, how many rounds, and the
    /// draws for them.
    fn draw(&self) -> Option<Fired> {
        if self.in_preemption.load(Ordering::SeqCst) {
            return None;
        }
        let owner = (*self.in_step.lock().expect("the clock's lock"))?;
        let mut policy = self.policy.lock().expect("the clock's lock");
        let p = policy.as_mut()?;
        let mut interjection = self.interjection.lock().expect("the clock's lock");
        let per_read = match interjection.as_ref() {
            Some(i) if i.owner == owner => i.per_read,
            _ => p.per_read,
        };
        if !p.rng.gen_bool(per_read) {
            return None;
        }
        let action = match interjection.as_ref() {
            Some(i) if i.owner == owner => interjection.take().map(|i| i.action),
            _ => None,
        };
        Some(Fired {
            rounds: draw_rounds(&mut p.rng, action.is_some()),
            rng: fork_rng(&mut p.rng),
            action,
        })
    }

    /// Run every free role for `rounds` rounds, time moving on before each.
    fn preempt(&self, fired: Fired) {
        let Fired {
            rounds,
            mut rng,
            action,
        } = fired;
        self.in_preemption.store(true, Ordering::SeqCst);
        if let Some(action) = action {
            action();
        }
        let mut others = self.runnable.lock().expect("the clock's lock").clone();
        let mut stepped = 0;
        for _ in 0..rounds {
            self.advance_ns(rng.gen_range(ROUND_NS));
            others.shuffle(&mut rng);
            for cell in &others {
                // The preempted role's cell is locked by its own step: skipped.
                if step_cell(cell, self.time_ns()).is_some() {
                    stepped += 1;
                }
            }
        }
        self.in_preemption.store(false, Ordering::SeqCst);
        self.fired.fetch_add(1, Ordering::SeqCst);
        self.stepped.fetch_add(stepped, Ordering::SeqCst);
    }
}

impl Clock for SimClock {
    fn now_ns(&self) -> u64 {
        if let Some(fired) = self.draw() {
            self.preempt(fired);
        }
        self.time_ns()
    }

    /// The simulated time on [`rowankv_types::ManualClock`]'s calendar. No
    /// preemption here: only expiry reads it.
    fn unix_ms(&self) -> u64 {
        rowankv_types::MANUAL_CLOCK_UNIX_MS_ORIGIN + self.time_ns() / 1_000_000
    }
}

/// A preemption that fired: its length, its draws, and an interjection's
/// action to run first.
struct Fired {
    rounds: u32,
    rng: ChaCha8Rng,
    action: Option<Box<dyn FnOnce() + Send>>,
}

/// [`SimClock::plain`].
#[derive(Debug)]
struct PlainView(Arc<SimClock>);

impl Clock for PlainView {
    fn now_ns(&self) -> u64 {
        self.0.time_ns()
    }

    fn unix_ms(&self) -> u64 {
        self.0.unix_ms()
    }
}

/// A generator for a preemption's own draws, from the simulator's.
pub fn fork_rng(rng: &mut ChaCha8Rng) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(rng.gen())
}
