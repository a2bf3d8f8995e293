//! The runtime that schedules a server's roles (DESIGN §6).
//!
//! The paper's threads — workers, the control thread, digest and clean threads — are
//! *roles*: each is a [`Task`], an event-driven state machine with a non-blocking
//! `step`. The [`Executor`] runs tasks on OS threads in one of two placements:
//! - `Shared`: tasks are spread over a few OS threads (`rowankv-exec-N`) that step
//!   their tasks round-robin. A whole in-process cluster (three servers with dozens
//!   of workers each, clients, the CM) runs this way on two cores.
//! - `Dedicated`: one OS thread per task, named after its role (`s0-worker-3`,
//!   `s0-control`, ...), as a deployed server pins one thread per core.
//!
//! The deterministic simulator steps the same tasks from one thread in an order
//! drawn from its seed.
//!
//! Roles whose one step may wait long on the medium — the clean roles, whose
//! passes copy whole segments at the media model's bandwidth — say so
//! ([`Task::waits_on_media`]) and also get an OS thread of their own in the
//! shared placement (at the normal priority), so that their waits do not hold
//! up the workers they would share a thread with.
//!
//! Roles on the failure detector's clock — a server's lease role, the CMs, and
//! a server's control role, which answers `Prepare` — say so
//! ([`Task::keeps_time`]); in the shared placement each of them still gets an OS
//! thread of its own. A busy shared thread (a worker applying a batch, a digest
//! pass) would otherwise hold up the renewals behind it for longer than a lease
//! and get a live server evicted; FaRM likewise runs its lease manager on a
//! dedicated thread. Those threads are idle nearly always, and back off to
//! sleeping up to [`TIMELY_IDLE_SLEEP_MAX`] between steps. They also run at a
//! raised scheduling priority ([`TIMELY_NICE`], as FaRM runs its lease manager
//! at the highest user-space priority): when the cores are contended — by the
//! store's own busy threads or by anything else on the machine — a thread that
//! wakes up to renew a lease runs ahead of them instead of waiting its turn.
//! Raising a priority needs `CAP_SYS_NICE` (root); without it the threads run at
//! the normal priority, and say so once in the log.
//!
//! A thread that finds all its tasks idle for a while yields, then sleeps briefly,
//! so an idle cluster does not hold the cores.
//!
//! A third placement, `Modelled`, runs a cluster on **modelled time**
//! (`docs/cpu-model.md`): one OS thread steps every task in the order of
//! the modelled time at which it is ready, on a [`ManualClock`] it moves
//! itself. Each task has a modelled core of its own (the paper pins one
//! thread per core); a step occupies that core for its measured time on this
//! machine minus the time spent inside fabric calls (the emulated NIC's
//! work, which the wire model times instead), plus its stalls on modelled
//! DIMMs and a host cost per verb ([`CpuModel`], accounted by
//! [`rowankv_types::cpu_model`]). A task that found nothing to do is
//! stepped again one poll gap later.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use rowankv_types::{cpu_model, Clock, ManualClock};

/// What one step of a task did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Idle,
    /// Some work was done; step again soon.
    Worked,
    /// The task has ended (its server stopped or crashed); drop it.
    Done,
}

/// A gate that opens once per `interval_ns` (roles that run periodically).
#[derive(Clone, Copy, Debug)]
pub struct Periodic {
    interval_ns: u64,
    next_ns: u64,
}

impl Periodic {
    pub fn new(interval_ns: u64) -> Periodic {
        Periodic {
            interval_ns,
            next_ns: 0,
        }
    }

    /// Whether the period has come round at `now_ns` (and start the next one).
    pub fn due(&mut self, now_ns: u64) -> bool {
        if now_ns < self.next_ns {
            return false;
        }
        self.next_ns = now_ns + self.interval_ns;
        true
    }
}

/// A role: an event-driven state machine.
pub trait Task: Send {
    /// The role's name, `s<server>-<role>[-<index>]`.
    fn name(&self) -> &str;
    /// Do what can be done now without blocking.
    fn step(&mut self, now_ns: u64) -> Step;
    /// Whether the role is on the failure detector's clock (holds or grants
    /// leases, answers the failover protocol): it must be stepped on time, so it
    /// never shares a thread with other roles.
    fn keeps_time(&self) -> bool {
        false
    }
    /// Whether one step may hold its thread for long on the medium (a
    /// cleaner's pass copies whole segments, and with the media model's timing
    /// on it waits for the DIMMs' bandwidth): on a shared placement it gets an
    /// OS thread of its own, as Rowan-KV gives its clean threads cores of their
    /// own (seed 000 §6.1), so that its waits do not stall the workers it would
    /// share a thread with. The OS then shares the cores between them.
    fn waits_on_media(&self) -> bool {
        false
    }
}

/// Where tasks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Round-robin on `threads` OS threads.
    Shared { threads: usize },
    /// One OS thread per task, named after the role.
    Dedicated,
    /// On modelled time: a modelled core per task, charged by the CPU model
    /// (built with [`Executor::modelled`]).
    Modelled(CpuModel),
}

/// The parameters of the CPU model of a modelled-time executor. Every result
/// measured with it carries [`CpuModel::label`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuModel {
    /// The host's cost of one call that posts work requests or receive
    /// buffers (building the descriptors, ringing the doorbell).
    pub post_ns: u64,
    /// The host's cost of polling one completion queue.
    pub poll_ns: u64,
    /// How soon a worker or client that found nothing to do is stepped again
    /// (its busy-polling loop, coarsened).
    pub idle_poll_ns: u64,
    /// The same for roles that keep time or wait on media (leases, the CMs,
    /// control, cleaners): they act on millisecond scales.
    pub background_poll_ns: u64,
    /// How often the fabric's due landings and completions are carried out
    /// when no poller did it first.
    pub drive_ns: u64,
}

impl Default for CpuModel {
    fn default() -> Self {
        CpuModel {
            post_ns: 150,
            poll_ns: 30,
            idle_poll_ns: 1_000,
            background_poll_ns: 20_000,
            drive_ns: 1_000,
        }
    }
}

impl CpuModel {
    /// One line naming the model and its parameters.
    pub fn label(&self) -> String {
        format!(
            "CPU model on (modelled time): a core per role, charged its measured step time \
             minus fabric calls, + {} ns per post, {} ns per poll; idle poll gap {} ns \
             ({} ns for background roles), fabric driven every {} ns",
            self.post_ns, self.poll_ns, self.idle_poll_ns, self.background_poll_ns, self.drive_ns
        )
    }

    /// Refuses gaps of zero: modelled time would stop (a drive loop that
    /// never moves on, an idle step that costs nothing).
    pub fn check(&self) -> Result<(), String> {
        if self.idle_poll_ns == 0 || self.background_poll_ns == 0 || self.drive_ns == 0 {
            return Err(format!(
                "CPU model: idle_poll_ns, background_poll_ns and drive_ns must be positive \
                 ({}, {}, {})",
                self.idle_poll_ns, self.background_poll_ns, self.drive_ns
            ));
        }
        Ok(())
    }
}

/// Idle rounds before a thread yields its core, and before it sleeps.
const IDLE_ROUNDS_BEFORE_YIELD: u32 = 64;
const IDLE_ROUNDS_BEFORE_SLEEP: u32 = 256;
const IDLE_SLEEP: Duration = Duration::from_micros(50);
/// The longest sleep of an idle lease-keeping thread: its idle sleep doubles from
/// `IDLE_SLEEP` up to this, so a thread that is nearly always idle wakes about a
/// thousand times a second, and one that is paging entries (recovery) does not
/// wait long between pages.
pub const TIMELY_IDLE_SLEEP_MAX: Duration = Duration::from_millis(1);
/// The nice value of the threads that keep time (the highest priority of the
/// normal scheduling class; real-time classes are not used, so a role that
/// turns busy cannot lock up a core).
pub const TIMELY_NICE: i32 = -20;

/// Give the calling thread the highest priority of the normal scheduling class
/// (nice [`TIMELY_NICE`]); whether it could.
pub fn raise_priority() -> bool {
    thread_priority::set_current_thread_priority(thread_priority::ThreadPriority::Max).is_ok()
}

/// Logged once: the time-keeping threads could not be raised.
static PRIORITY_WARNED: AtomicBool = AtomicBool::new(false);

struct ThreadHandle {
    inject: Sender<Box<dyn Task>>,
    join: JoinHandle<Vec<Box<dyn Task>>>,
}

/// Runs tasks until stopped.
pub struct Executor {
    placement: Placement,
    clock: Arc<dyn Clock>,
    stop: Arc<AtomicBool>,
    threads: Vec<ThreadHandle>,
    /// The first `shared` threads take tasks round-robin.
    shared: usize,
    next: usize,
}

impl Executor {
    /// An executor of the `Shared` or `Dedicated` placement (`Modelled` needs
    /// [`Executor::modelled`]).
    pub fn new(placement: Placement, clock: Arc<dyn Clock>) -> Executor {
        assert!(
            !matches!(placement, Placement::Modelled(_)),
            "a modelled-time executor is built with Executor::modelled"
        );
        let mut ex = Executor {
            placement,
            clock,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            shared: 0,
            next: 0,
        };
        if let Placement::Shared { threads } = placement {
            for i in 0..threads.max(1) {
                ex.start_thread(format!("rowankv-exec-{i}"), Vec::new(), IDLE_SLEEP, false);
            }
            ex.shared = ex.threads.len();
        }
        ex
    }

    /// An executor on modelled time: one thread steps every task and moves
    /// `clock`; `drive` carries out the fabric's due work and returns when
    /// the next is due (`LoopbackFabric::progress_due` of a driven fabric).
    pub fn modelled(
        model: CpuModel,
        clock: Arc<ManualClock>,
        drive: Box<dyn FnMut() -> Option<u64> + Send>,
    ) -> Executor {
        if let Err(e) = model.check() {
            panic!("{e}");
        }
        let (tx, rx) = channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let stop_ = stop.clone();
        let join = std::thread::Builder::new()
            .name("rowankv-modelled".into())
            .spawn(move || run_modelled(rx, stop_, clock, drive, model))
            .expect("spawning the modelled-time executor thread");
        Executor {
            placement: Placement::Modelled(model),
            clock: dyn_clock,
            stop,
            threads: vec![ThreadHandle { inject: tx, join }],
            shared: 1,
            next: 0,
        }
    }

    fn start_thread(
        &mut self,
        name: String,
        tasks: Vec<Box<dyn Task>>,
        sleep_max: Duration,
        timely: bool,
    ) {
        let (tx, rx) = channel::unbounded();
        let stop = self.stop.clone();
        let clock = self.clock.clone();
        let join = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                if timely && !raise_priority() && !PRIORITY_WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        nice = TIMELY_NICE,
                        "lease-keeping threads run at the normal priority (no CAP_SYS_NICE)"
                    );
                }
                run_thread(tasks, rx, stop, clock, sleep_max)
            })
            .expect("spawning an executor thread");
        self.threads.push(ThreadHandle { inject: tx, join });
    }

    /// Start running `task`.
    pub fn spawn(&mut self, task: Box<dyn Task>) {
        match self.placement {
            Placement::Dedicated => {
                let name = task.name().to_string();
                let timely = task.keeps_time();
                self.start_thread(name, vec![task], IDLE_SLEEP, timely);
            }
            Placement::Shared { .. } if task.keeps_time() => {
                let name = task.name().to_string();
                self.start_thread(name, vec![task], TIMELY_IDLE_SLEEP_MAX, true);
            }
            Placement::Shared { .. } if task.waits_on_media() => {
                let name = task.name().to_string();
                self.start_thread(name, vec![task], TIMELY_IDLE_SLEEP_MAX, false);
            }
            Placement::Modelled(_) => {
                let _ = self.threads[0].inject.send(task);
            }
            Placement::Shared { .. } => {
                let i = self.next % self.shared;
                self.next += 1;
                let _ = self.threads[i].inject.send(task);
            }
        }
    }

    /// Stop every thread; returns the tasks still running.
    pub fn stop(self) -> Vec<Box<dyn Task>> {
        self.stop.store(true, Ordering::Release);
        let mut tasks = Vec::new();
        for t in self.threads {
            drop(t.inject);
            if let Ok(mut ts) = t.join.join() {
                tasks.append(&mut ts);
            }
        }
        tasks
    }
}

fn run_thread(
    mut tasks: Vec<Box<dyn Task>>,
    inject: Receiver<Box<dyn Task>>,
    stop: Arc<AtomicBool>,
    clock: Arc<dyn Clock>,
    sleep_max: Duration,
) -> Vec<Box<dyn Task>> {
    let mut idle_rounds = 0u32;
    let mut sleep = IDLE_SLEEP;
    while !stop.load(Ordering::Acquire) {
        while let Ok(t) = inject.try_recv() {
            tasks.push(t);
        }
        let mut did = false;
        let mut i = 0;
        while i < tasks.len() {
            match tasks[i].step(clock.now_ns()) {
                Step::Idle => i += 1,
                Step::Worked => {
                    did = true;
                    i += 1;
                }
                Step::Done => {
                    drop(tasks.swap_remove(i));
                }
            }
        }
        if did {
            idle_rounds = 0;
            sleep = IDLE_SLEEP;
        } else {
            idle_rounds = idle_rounds.saturating_add(1);
            if idle_rounds > IDLE_ROUNDS_BEFORE_SLEEP {
                std::thread::sleep(sleep);
                sleep = (sleep * 2).min(sleep_max);
            } else if idle_rounds > IDLE_ROUNDS_BEFORE_YIELD {
                std::thread::yield_now();
            }
        }
    }
    tasks
}

/// One task of a modelled-time executor.
struct Modelled {
    task: Box<dyn Task>,
    background: bool,
}

/// The modelled-time loop: always step the task ready earliest, at that
/// time; charge its step to its core.
fn run_modelled(
    inject: Receiver<Box<dyn Task>>,
    stop: Arc<AtomicBool>,
    clock: Arc<ManualClock>,
    mut drive: Box<dyn FnMut() -> Option<u64> + Send>,
    model: CpuModel,
) -> Vec<Box<dyn Task>> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut tasks: Vec<Option<Modelled>> = Vec::new();
    let mut ready: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut next_drive = 0u64;
    let mut next_due: Option<u64> = None;
    let mut checked = 0u32;
    let advance_to = |t: u64| {
        let now = clock.now_ns();
        if t > now {
            clock.advance_ns(t - now);
        }
    };
    loop {
        // New tasks and the stop flag, every so often (a channel read and an
        // atomic load per step would cost more than many steps).
        checked = checked.wrapping_add(1);
        if checked.is_multiple_of(64) || ready.is_empty() {
            if stop.load(Ordering::Acquire) {
                break;
            }
            while let Ok(task) = inject.try_recv() {
                let background = task.keeps_time() || task.waits_on_media();
                let i = tasks.len();
                tasks.push(Some(Modelled { task, background }));
                ready.push(Reverse((clock.now_ns(), seq, i)));
                seq += 1;
            }
            if ready.is_empty() {
                std::thread::sleep(IDLE_SLEEP);
                continue;
            }
        }
        let Reverse((at, _, i)) = ready.pop().expect("not empty");
        // The fabric's due work first, at its due times, and every
        // `drive_ns` in any case (work posted since the last drive).
        loop {
            let due = match next_due {
                Some(d) if d <= at => d,
                _ if next_drive <= at => next_drive,
                _ => break,
            };
            advance_to(due);
            let now = clock.now_ns();
            next_due = drive().filter(|&d| d > now);
            next_drive = now + model.drive_ns;
        }
        advance_to(at);
        let slot = tasks[i].as_mut().expect("a task in the queue");
        cpu_model::begin_step(at);
        let step = slot.task.step(at);
        let cost = cpu_model::end_step().cpu_ns(model.post_ns, model.poll_ns);
        let gap = if slot.background {
            model.background_poll_ns
        } else {
            model.idle_poll_ns
        };
        match step {
            // Work a step posted is carried out by its pollers (every poll
            // drives its queue pairs) or by the next drive.
            Step::Worked => ready.push(Reverse((at + cost.max(1), seq, i))),
            Step::Idle => ready.push(Reverse((at + cost.max(gap), seq, i))),
            Step::Done => tasks[i] = None,
        }
        seq += 1;
    }
    tasks.into_iter().flatten().map(|m| m.task).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowankv_types::SystemClock;
    use std::sync::atomic::AtomicU64;

    /// Holds its thread inside `step` until the lease keeper has been stepped.
    struct Hog {
        keeper_stepped: Receiver<String>,
        seen: Sender<Option<String>>,
        done: bool,
    }

    impl Task for Hog {
        fn name(&self) -> &str {
            "hog"
        }
        fn step(&mut self, _now_ns: u64) -> Step {
            if self.done {
                return Step::Idle;
            }
            self.done = true;
            let got = self
                .keeper_stepped
                .recv_timeout(Duration::from_secs(20))
                .ok();
            let _ = self.seen.send(got);
            Step::Worked
        }
    }

    struct Keeper {
        steps: Arc<AtomicU64>,
        tell: Sender<String>,
        nice: Sender<i32>,
    }

    /// The calling thread's nice value, from `/proc` (field 19 of its `stat`).
    fn own_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("the thread's stat");
        // The name may hold spaces; the fields after it do not.
        let after_name = &stat[stat.rfind(')').expect("a name in parentheses") + 2..];
        after_name
            .split(' ')
            .nth(16)
            .and_then(|f| f.parse().ok())
            .expect("a nice value")
    }

    /// Whether this process may raise a thread's priority: `CAP_SYS_NICE` (bit
    /// 23) among its effective capabilities, as `/proc` lists them.
    fn may_raise_priority() -> bool {
        const CAP_SYS_NICE: u32 = 23;
        let status = std::fs::read_to_string("/proc/self/status").expect("the process status");
        let caps = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .map(|h| u64::from_str_radix(h.trim(), 16).expect("hex capabilities"))
            .expect("a CapEff line");
        caps & (1 << CAP_SYS_NICE) != 0
    }

    impl Task for Keeper {
        fn name(&self) -> &str {
            "s0-control"
        }
        fn step(&mut self, _now_ns: u64) -> Step {
            if self.steps.fetch_add(1, Ordering::Relaxed) == 0 {
                let thread = std::thread::current().name().unwrap_or("").to_string();
                let _ = self.tell.send(thread);
                let _ = self.nice.send(own_nice());
            }
            Step::Idle
        }
        fn keeps_time(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_lease_keeper_is_stepped_while_a_shared_thread_is_held() {
        let mut ex = Executor::new(Placement::Shared { threads: 1 }, SystemClock::new());
        let (tell, keeper_stepped) = channel::unbounded();
        let (seen, seen_rx) = channel::unbounded();
        let (nice, nice_rx) = channel::unbounded();
        let steps = Arc::new(AtomicU64::new(0));
        // The hog takes the only shared thread and waits for the keeper there: had
        // the keeper been placed behind it, it would never be stepped.
        ex.spawn(Box::new(Hog {
            keeper_stepped,
            seen,
            done: false,
        }));
        ex.spawn(Box::new(Keeper {
            steps: steps.clone(),
            tell,
            nice,
        }));
        let got = seen_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the hog returned");
        assert_eq!(got.as_deref(), Some("s0-control"), "the keeper's thread");
        // It runs at the raised priority where the process may raise one, and
        // at the normal one otherwise.
        let expected = if may_raise_priority() { TIMELY_NICE } else { 0 };
        assert_eq!(nice_rx.recv().unwrap(), expected, "the keeper's nice value");
        let tasks = ex.stop();
        assert_eq!(tasks.len(), 2, "both tasks handed back");
        assert!(steps.load(Ordering::Relaxed) >= 1);
    }

    /// A cleaner-like role: its one step holds its thread until a plain role
    /// has been stepped, and reports that role's thread and its own.
    struct MediaHog {
        other_stepped: Receiver<String>,
        seen: Sender<(Option<String>, String)>,
        done: bool,
    }

    impl Task for MediaHog {
        fn name(&self) -> &str {
            "s0-clean-0"
        }
        fn step(&mut self, _now_ns: u64) -> Step {
            if self.done {
                return Step::Idle;
            }
            self.done = true;
            let other = self
                .other_stepped
                .recv_timeout(Duration::from_secs(20))
                .ok();
            let own = std::thread::current().name().unwrap_or("").to_string();
            let _ = self.seen.send((other, own));
            Step::Worked
        }
        fn waits_on_media(&self) -> bool {
            true
        }
    }

    /// A plain role that tells the thread it was first stepped on.
    struct Plain {
        tell: Sender<String>,
        told: bool,
    }

    impl Task for Plain {
        fn name(&self) -> &str {
            "s0-worker-0"
        }
        fn step(&mut self, _now_ns: u64) -> Step {
            if !self.told {
                self.told = true;
                let thread = std::thread::current().name().unwrap_or("").to_string();
                let _ = self.tell.send(thread);
            }
            Step::Idle
        }
    }

    #[test]
    fn a_cleaner_waiting_on_the_medium_does_not_hold_up_a_shared_thread() {
        let mut ex = Executor::new(Placement::Shared { threads: 1 }, SystemClock::new());
        let (tell, other_stepped) = channel::unbounded();
        let (seen, seen_rx) = channel::unbounded();
        // Spawned first: had it been given the only shared thread, the plain
        // role behind it would not be stepped while it holds the thread.
        ex.spawn(Box::new(MediaHog {
            other_stepped,
            seen,
            done: false,
        }));
        ex.spawn(Box::new(Plain { tell, told: false }));
        let (other, own) = seen_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the cleaner's step returned");
        assert_eq!(
            other.as_deref(),
            Some("rowankv-exec-0"),
            "the plain role's thread"
        );
        assert_eq!(own, "s0-clean-0", "the cleaner's own thread");
        assert_eq!(ex.stop().len(), 2, "both tasks handed back");
    }

    /// Spins for `work` per step, `steps` times, inside a fabric call or
    /// not; reports the modelled time it ended at and the real time it spun.
    struct Spinner {
        name: &'static str,
        left: u32,
        work: Duration,
        in_fabric: bool,
        spun: Duration,
        ended: Sender<(&'static str, u64, Duration)>,
    }

    impl Task for Spinner {
        fn name(&self) -> &str {
            self.name
        }
        fn step(&mut self, now_ns: u64) -> Step {
            if self.left == 0 {
                let _ = self.ended.send((self.name, now_ns, self.spun));
                return Step::Done;
            }
            self.left -= 1;
            let _call = self
                .in_fabric
                .then(|| cpu_model::FabricCall::enter(cpu_model::CallKind::Post));
            let t = std::time::Instant::now();
            while t.elapsed() < self.work {
                std::hint::spin_loop();
            }
            self.spun += t.elapsed();
            Step::Worked
        }
    }

    /// On modelled time each role has a core of its own: two busy roles
    /// run side by side, each taking its own CPU time, and what a role does
    /// inside the fabric (the emulated NIC's work) costs it only the host's
    /// cost of the post.
    #[test]
    fn on_modelled_time_roles_run_on_cores_of_their_own_and_the_nics_work_is_free() {
        let clock = ManualClock::new();
        let model = CpuModel::default();
        let mut ex = Executor::modelled(model, clock.clone(), Box::new(|| None));
        let (tx, rx) = channel::unbounded();
        let spinner = |name, in_fabric| Spinner {
            name,
            left: 200,
            work: Duration::from_micros(20),
            in_fabric,
            spun: Duration::ZERO,
            ended: tx.clone(),
        };
        ex.spawn(Box::new(spinner("s0-a", false)));
        ex.spawn(Box::new(spinner("s1-b", false)));
        ex.spawn(Box::new(spinner("s2-nic", true)));
        let mut ended = std::collections::HashMap::new();
        for _ in 0..3 {
            let (name, at, spun) = rx.recv_timeout(Duration::from_secs(30)).expect("ended");
            ended.insert(name, (at, spun.as_nanos() as u64));
        }
        assert!(ex.stop().is_empty(), "every spinner ended");
        let (a_at, a_spun) = ended["s0-a"];
        let (b_at, b_spun) = ended["s1-b"];
        // Each ends after its own CPU time...
        assert!(a_at >= a_spun && b_at >= b_spun, "{ended:?}");
        // ...and not after the other's as well (one core would give a + b).
        assert!(a_at < a_spun + b_spun / 2, "{ended:?}");
        assert!(b_at < b_spun + a_spun / 2, "{ended:?}");
        // 200 posts at the model's host cost, not 200 x 20 us of NIC work.
        let (nic_at, nic_spun) = ended["s2-nic"];
        assert!(nic_at >= 200 * model.post_ns, "{ended:?}");
        assert!(nic_at < nic_spun / 4, "{ended:?}");
    }
}
