//! Accounting for the CPU model of a modelled-time cluster (`docs/cpu-model.md`).
//!
//! A cluster on modelled time runs every role from one OS thread and charges
//! each step to the modelled core of its role. The charge is the step's
//! measured time on this machine *minus* the time spent inside fabric calls
//! (on `loopback` those calls do the NIC's work — copying a WRITE into the
//! target's memory, landing a SEND, answering a READ — which a real NIC does
//! without any core; the wire model times it instead), *plus* the time the
//! step's stores stall on a modelled DIMM that is behind (the media model,
//! on modelled time, adds it here instead of spinning), plus a fixed host cost
//! per verb posted and per completion queue polled.
//!
//! The state is per thread: only the thread inside [`begin_step`] …
//! [`end_step`] is accounted, every other thread (tests, a cluster on real
//! time) sees [`modelled_now_ns`] `None` and is untouched. The fabric wraps
//! each of its calls in a [`FabricCall`]; the media model asks
//! [`modelled_now_ns`] for the modelled time of a store and reports a stall
//! with [`add_media_stall_ns`].

use std::cell::Cell;
use std::time::Instant;

#[derive(Clone, Copy)]
struct Account {
    /// The modelled time at which the step began.
    start_ns: u64,
    /// When the step began on this machine.
    began: Instant,
    /// Nested fabric calls (only the outermost one is timed).
    depth: u32,
    /// When the outermost fabric call began.
    call_began: Instant,
    fabric_ns: u64,
    stall_ns: u64,
    posts: u64,
    polls: u64,
}

thread_local! {
    static ACCOUNT: Cell<Option<Account>> = const { Cell::new(None) };
}

/// What one step cost, measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCharge {
    /// The step's time on this machine, fabric calls included.
    pub wall_ns: u64,
    /// The time inside fabric calls (the emulated NIC's work).
    pub fabric_ns: u64,
    /// Modelled stalls on the DIMMs outside fabric calls.
    pub stall_ns: u64,
    /// Verbs posted (each a `post_send` or `post_recv` call).
    pub posts: u64,
    /// Completion queues polled.
    pub polls: u64,
}

impl StepCharge {
    /// The modelled CPU time: the step's time without the NIC's work, plus
    /// its stalls and the host's cost of its verbs.
    pub fn cpu_ns(&self, post_ns: u64, poll_ns: u64) -> u64 {
        self.wall_ns.saturating_sub(self.fabric_ns)
            + self.stall_ns
            + self.posts * post_ns
            + self.polls * poll_ns
    }
}

/// Start accounting a step of this thread that begins at modelled time
/// `start_ns`.
pub fn begin_step(start_ns: u64) {
    let now = Instant::now();
    ACCOUNT.with(|a| {
        a.set(Some(Account {
            start_ns,
            began: now,
            depth: 0,
            call_began: now,
            fabric_ns: 0,
            stall_ns: 0,
            posts: 0,
            polls: 0,
        }))
    });
}

/// End the step begun with [`begin_step`] and return what it cost.
pub fn end_step() -> StepCharge {
    let now = Instant::now();
    ACCOUNT.with(|a| match a.take() {
        Some(acc) => StepCharge {
            wall_ns: now.duration_since(acc.began).as_nanos() as u64,
            fabric_ns: acc.fabric_ns,
            stall_ns: acc.stall_ns,
            posts: acc.posts,
            polls: acc.polls,
        },
        None => StepCharge::default(),
    })
}

/// The modelled time at this point of the current step: its start plus the
/// CPU time it has used so far (fabric calls excluded, stalls included).
/// `None` outside a modelled step.
pub fn modelled_now_ns() -> Option<u64> {
    let now = Instant::now();
    ACCOUNT.with(|a| {
        a.get().map(|acc| {
            let in_call = if acc.depth > 0 {
                now.duration_since(acc.call_began).as_nanos() as u64
            } else {
                0
            };
            let wall = now.duration_since(acc.began).as_nanos() as u64;
            acc.start_ns + (wall.saturating_sub(acc.fabric_ns + in_call)) + acc.stall_ns
        })
    })
}

/// How far into the current modelled step this point is (0 outside one):
/// what a request posted now adds to the step's start time.
pub fn step_offset_ns() -> u64 {
    let start = ACCOUNT.with(|a| a.get().map(|acc| acc.start_ns));
    match (start, modelled_now_ns()) {
        (Some(s), Some(n)) => n.saturating_sub(s),
        _ => 0,
    }
}

/// A stall of a store on a modelled DIMM: charged to the step unless it
/// happened inside a fabric call (a NIC's DMA does not stall a core).
pub fn add_media_stall_ns(ns: u64) {
    ACCOUNT.with(|a| {
        if let Some(mut acc) = a.get() {
            if acc.depth == 0 {
                acc.stall_ns += ns;
                a.set(Some(acc));
            }
        }
    });
}

/// What kind of fabric call a [`FabricCall`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Posting work requests or receive buffers.
    Post,
    /// Polling a completion queue.
    Poll,
    /// Anything else (connecting, registering).
    Other,
}

/// Times one fabric call while it lives (a no-op outside a modelled step).
pub struct FabricCall {
    active: bool,
}

impl FabricCall {
    pub fn enter(kind: CallKind) -> FabricCall {
        let active = ACCOUNT.with(|a| {
            let Some(mut acc) = a.get() else {
                return false;
            };
            if acc.depth == 0 {
                acc.call_began = Instant::now();
                match kind {
                    CallKind::Post => acc.posts += 1,
                    CallKind::Poll => acc.polls += 1,
                    CallKind::Other => {}
                }
            }
            acc.depth += 1;
            a.set(Some(acc));
            true
        });
        FabricCall { active }
    }
}

impl Drop for FabricCall {
    fn drop(&mut self) {
        if !self.active {
            return;
        }
        let now = Instant::now();
        ACCOUNT.with(|a| {
            if let Some(mut acc) = a.get() {
                acc.depth = acc.depth.saturating_sub(1);
                if acc.depth == 0 {
                    acc.fabric_ns += now.duration_since(acc.call_began).as_nanos() as u64;
                }
                a.set(Some(acc));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn busy(d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn fabric_time_is_not_charged_and_stalls_are() {
        begin_step(1_000);
        busy(Duration::from_millis(2));
        {
            let _c = FabricCall::enter(CallKind::Post);
            {
                let _nested = FabricCall::enter(CallKind::Poll);
                busy(Duration::from_millis(50));
                // A NIC's DMA stalls no core.
                add_media_stall_ns(1_000_000_000);
            }
        }
        add_media_stall_ns(7_000_000);
        let now = modelled_now_ns().expect("inside a step");
        let c = end_step();
        assert!(c.fabric_ns >= 50_000_000, "{c:?}");
        assert_eq!(c.stall_ns, 7_000_000);
        assert_eq!((c.posts, c.polls), (1, 0), "only the outermost call counts");
        let cpu = c.cpu_ns(100, 10);
        // Not the 50 ms in the fabric (a preempted thread may add some).
        assert!((9_000_000..40_000_000).contains(&cpu), "{c:?} {cpu}");
        // 2 ms of work and 7 ms of stall, not the 50 ms in the fabric.
        assert!(
            (1_000 + 9_000_000..1_000 + 40_000_000).contains(&now),
            "{now}"
        );
        assert_eq!(modelled_now_ns(), None);
        assert_eq!(step_offset_ns(), 0);
    }

    #[test]
    fn outside_a_step_nothing_is_accounted() {
        let _c = FabricCall::enter(CallKind::Post);
        add_media_stall_ns(5);
        assert_eq!(modelled_now_ns(), None);
        assert_eq!(end_step(), StepCharge::default());
    }
}
