//! The background roles of a server (seed 000 §4.1): digest roles and clean
//! roles (the control role is in [`crate::control`]), and under `drpc` the redo
//! role, which executes the redo rings into the b-log.

use std::sync::Arc;

use rowankv_fabric::Nic;

use crate::runtime::{Periodic, Step, Task};
use crate::server::ServerShared;

/// Digest role `d`: installs its shards' entries from used b-log segments.
pub struct DigestTask<N: Nic> {
    name: String,
    shared: Arc<ServerShared<N>>,
    d: usize,
}

impl<N: Nic> DigestTask<N> {
    pub fn new(shared: Arc<ServerShared<N>>, d: usize) -> Self {
        DigestTask {
            name: format!("s{}-digest-{d}", shared.node.0),
            shared,
            d,
        }
    }
}

impl<N: Nic> Task for DigestTask<N> {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, _now_ns: u64) -> Step {
        if self.shared.stopped() {
            return Step::Done;
        }
        if self.shared.buggify("digest.skip-step") {
            return Step::Idle;
        }
        match self.shared.blog.digest_step(self.d) {
            Ok(0) => Step::Idle,
            Ok(_) => Step::Worked,
            Err(e) => {
                tracing::error!(role = %self.name, error = %e, "digest step");
                Step::Idle
            }
        }
    }
}

/// Clean role `c`, every `clean_interval_ns`.
pub struct CleanTask<N: Nic> {
    name: String,
    shared: Arc<ServerShared<N>>,
    c: usize,
    period: Periodic,
}

impl<N: Nic> CleanTask<N> {
    pub fn new(shared: Arc<ServerShared<N>>, c: usize) -> Self {
        CleanTask {
            name: format!("s{}-clean-{c}", shared.node.0),
            period: Periodic::new(shared.settings.clean_interval_ns),
            shared,
            c,
        }
    }
}

impl<N: Nic> Task for CleanTask<N> {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, now_ns: u64) -> Step {
        if self.shared.stopped() {
            return Step::Done;
        }
        if !self.period.due(now_ns) || self.shared.buggify("clean.skip-step") {
            return Step::Idle;
        }
        let cleaned = self.shared.engine.clean_as(self.c);
        if let Ok(r) = &cleaned {
            self.shared.stats.count_clean(r);
        }
        match cleaned {
            Ok(r) if r.segments_cleaned > 0 || r.segments_freed > 0 => Step::Worked,
            Ok(_) => Step::Idle,
            Err(e) => {
                tracing::error!(role = %self.name, error = %e, "clean pass");
                Step::Idle
            }
        }
    }

    fn waits_on_media(&self) -> bool {
        true
    }
}

/// The redo role (`drpc`): executes the requests that landed in the server's
/// redo rings, appending their entries to the b-log
/// ([`crate::replication::redo`]).
///
/// Requests that wait for room in the b-log (deferred: see
/// [`crate::replication::redo::Appender`]) for longer than
/// [`crate::ServerSettings::redo_stall_limit`] stop the server
/// ([`ServerShared::fail_stop`]).
pub struct RedoTask<N: Nic> {
    name: String,
    shared: Arc<ServerShared<N>>,
    /// Since when (role clock) requests have waited with none executed.
    stalled_since_ns: Option<u64>,
}

impl<N: Nic> RedoTask<N> {
    pub fn new(shared: Arc<ServerShared<N>>) -> Self {
        RedoTask {
            name: format!("s{}-redo", shared.node.0),
            shared,
            stalled_since_ns: None,
        }
    }
}

impl<N: Nic> Task for RedoTask<N> {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, now_ns: u64) -> Step {
        if self.shared.stopped() {
            return Step::Done;
        }
        let Some(rings) = self.shared.redo.get() else {
            return Step::Done;
        };
        if self.shared.settings.test_hold_redo_role || self.shared.buggify("redo.skip-step") {
            return Step::Idle;
        }
        let (executed, stalled) = {
            let mut r = rings.lock();
            let executed = r.poll();
            (executed, r.stalled())
        };
        if !stalled {
            self.stalled_since_ns = None;
        } else {
            let since = *self.stalled_since_ns.get_or_insert(now_ns);
            if now_ns.saturating_sub(since) > self.shared.settings.redo_stall_limit() {
                self.shared.fail_stop(format!(
                    "the b-log has had no room for the requests acknowledged by the redo \
                     rings for {} ms ({} free segments): they stay in the rings, and are \
                     executed at the next start",
                    (now_ns - since) / 1_000_000,
                    self.shared.engine.free_segments()
                ));
                return Step::Done;
            }
        }
        if executed > 0 {
            self.shared
                .stats
                .replicated_in
                .fetch_add(executed as u64, std::sync::atomic::Ordering::Relaxed);
            Step::Worked
        } else {
            Step::Idle
        }
    }
}
