//! The failover timeline: what the CM and the servers did, and when (on the
//! cluster's clock). The demo and the failover benchmark print it; the simulator
//! takes the commit times from it to check that no server answered with a
//! configuration older than one already committed.

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

/// Events in the order they were recorded.
#[derive(Debug, Default)]
pub struct EventLog {
    events: Mutex<Vec<Event>>,
}

impl EventLog {
    pub fn new() -> EventLog {
        EventLog::default()
    }

    pub fn record(&self, at_ns: u64, kind: EventKind) {
        tracing::info!(at_ns, ?kind, "failover event");
        self.events.lock().push(Event { at_ns, kind });
    }

    /// Every event so far.
    pub fn snapshot(&self) -> Vec<Event> {
        self.events.lock().clone()
    }

    /// Times at which configurations were committed: (term, ns).
    pub fn commits(&self) -> Vec<(Term, u64)> {
        self.events
            .lock()
            .iter()
            .filter_map(|e| match e.kind {
                EventKind::ConfigCommitted { term } => Some((term, e.at_ns)),
                _ => None,
            })
            .collect()
    }
}
