//! The failover timeline: what the CM and the servers did, and when (on the
//! cluster's clock). The demo and the failover benchmark print it; the simulator
//! takes the commit times from it to check that no server answered with a
//! configuration older than one already committed.

use std::collections::VecDeque;

use parking_lot::Mutex;
use rowankv_types::{NodeId, ShardId, Term};

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A CM became the active one (it holds the lease in the coordination store).
    CmActive { cm: NodeId, term: Term },
    /// The CM found a server's lease expired.
    ServerFailed { node: NodeId },
    /// The CM stored the configuration of `term` in the coordination store.
    ConfigStored { term: Term },
    /// Every server acknowledged `term` and the failed servers' leases expired:
    /// the CM sent the commit.
    ConfigCommitted { term: Term },
    /// A primary made `shard`'s replicas agree and serves it (promotion or cold
    /// start).
    ShardServed {
        node: NodeId,
        shard: ShardId,
        term: Term,
    },
    /// The CM found `node` overloaded (seed 000 §4.6): its load over the last
    /// statistics window, per second, against the members' average; the
    /// resharding plan would move `shard` (its hottest to move) to `to`.
    Overloaded {
        node: NodeId,
        load_per_s: u64,
        average_per_s: u64,
        shard: ShardId,
        to: NodeId,
    },
    /// A migration's target took `shard` over from `from` (seed 000 §4.6):
    /// it serves the shard from now on, while the copy goes on.
    MigrationServed {
        shard: ShardId,
        from: NodeId,
        to: NodeId,
    },
    /// A migration's source copied `shard`'s `entries` to its target and
    /// told the CMs.
    MigrationCopied {
        shard: ShardId,
        to: NodeId,
        entries: u64,
    },
    /// The CM struck a finished migration from the list (§4.6).
    MigrationFinished {
        shard: ShardId,
        from: NodeId,
        to: NodeId,
    },
    /// Re-replication of `shard` to `to` completed.
    ReplicaCopied {
        shard: ShardId,
        to: NodeId,
        entries: u64,
    },
}

/// An event and its time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at_ns: u64,
    pub kind: EventKind,
}

/// Events kept, at most: the oldest are dropped first (a long-lived server's
/// timeline must not grow without bound).
pub const EVENTS_MAX: usize = 1 << 16;
/// Configuration commits kept, at most (one per term).
pub const COMMITS_MAX: usize = 1 << 16;

/// The newest events, in the order they were recorded.
#[derive(Debug, Default)]
pub struct EventLog {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    events: VecDeque<Event>,
    /// Events dropped to keep `EVENTS_MAX`.
    dropped: u64,
    /// Commit times, kept apart so that a checker sees every one of them even
    /// after their events were dropped: (term, ns).
    commits: VecDeque<(Term, u64)>,
}

impl EventLog {
    pub fn new() -> EventLog {
        EventLog::default()
    }

    pub fn record(&self, at_ns: u64, kind: EventKind) {
        tracing::info!(at_ns, ?kind, "failover event");
        let mut inner = self.inner.lock();
        if let EventKind::ConfigCommitted { term } = kind {
            if inner.commits.len() == COMMITS_MAX {
                inner.commits.pop_front();
            }
            inner.commits.push_back((term, at_ns));
        }
        if inner.events.len() == EVENTS_MAX {
            inner.events.pop_front();
            inner.dropped += 1;
        }
        inner.events.push_back(Event { at_ns, kind });
    }

    /// The events kept (the newest `EVENTS_MAX`).
    pub fn snapshot(&self) -> Vec<Event> {
        self.inner.lock().events.iter().cloned().collect()
    }

    /// Events dropped so far to stay within `EVENTS_MAX`.
    pub fn dropped(&self) -> u64 {
        self.inner.lock().dropped
    }

    /// Times at which configurations were committed: (term, ns), the newest
    /// `COMMITS_MAX`.
    pub fn commits(&self) -> Vec<(Term, u64)> {
        self.inner.lock().commits.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_keeps_the_newest_events_and_every_recent_commit() {
        let log = EventLog::new();
        for i in 0..(EVENTS_MAX as u64 + 10) {
            log.record(i, EventKind::ServerFailed { node: NodeId(1) });
        }
        log.record(7, EventKind::ConfigCommitted { term: Term(2) });
        let events = log.snapshot();
        assert_eq!(events.len(), EVENTS_MAX);
        assert_eq!(log.dropped(), 11);
        assert_eq!(events.first().unwrap().at_ns, 11, "the oldest were dropped");
        assert_eq!(log.commits(), vec![(Term(2), 7)]);
    }
}
