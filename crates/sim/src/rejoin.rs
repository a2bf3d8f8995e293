//! A removed server's way back into the simulated cluster, as the processes
//! take it (`rowankv_deploy::server::run_once`, `rowankv_deploy::cm`): a
//! server crashed while a member and restarted after the CM removed it joins
//! through a CM's join desk, waits to be a member
//! ([`rowankv_deploy::join::MembershipWait`], on the simulated clock) and asks
//! the CMs again when it waited too long; once a member, it recovers or
//! formats its pool as `rowankv server` decides
//! ([`rowankv_deploy::join::Restart`], `restart_decision`) from its pool's
//! identity record — the real one, in the simulated pool: a stale mark
//! persisted at once on news of a removal, and the member term recorded
//! before the server serves or is filled — and the signs it met: the desk's
//! answer (`added`, and the term of the desk's view) and the configurations
//! it read. Formatted, it is filled again as a joining backup. A server
//! restarted within its lease takes the same decision, fed by a desk's answer
//! and the configuration it then reads.
//!
//! The join desk is the real one's decision ([`rowankv_deploy::cm::adds_a_member`])
//! on a view of the configuration reloaded every 50 ms of simulated time, as a
//! CM process reloads it: a server that joins shortly after the CM removed it
//! may be answered from the older term, as a member that rejoined, and nothing
//! is queued; a server restarted shortly after the CM added it may be
//! answered from a view that lacks it, as a server the CM adds. A desk whose
//! view lacks the server hands it to its CM's role
//! (`rowankv_cm::role::Joins`) only if that CM is the active one (a standby
//! answers `standby`, and the server asks the next CM); a CM that crashes
//! before its role took the join loses it.

use std::sync::Arc;

use rowankv_types::NodeId;
use rowankv_wire::config::{Config, ConfigSource};

use rowankv_deploy::join::{MembershipWait, Restart};

/// A desk reloads its view of the configuration this often (`rowankv cm`).
pub(crate) const DESK_RELOAD_NS: u64 = 50_000_000;
/// A server waiting to be a member reads the configuration this often: well
/// within a lease (the CM counts a lease granted when it adds a server, and a
/// server that does not renew it in time is removed again).
pub(crate) const READ_EVERY_NS: u64 = 1_000_000;
/// A join no CM answered is tried again after this
/// (`rowankv_deploy::join::join`).
pub(crate) const ASK_EVERY_NS: u64 = 100_000_000;

/// One CM's join desk: its view of the configuration.
pub(crate) struct JoinDesk {
    view: Option<Arc<Config>>,
    next_reload_ns: u64,
}

impl JoinDesk {
    /// A desk of a CM (re)started at `now_ns`: it reads the configuration at once.
    pub(crate) fn new(source: &dyn ConfigSource, now_ns: u64) -> JoinDesk {
        let mut d = JoinDesk {
            view: None,
            next_reload_ns: now_ns,
        };
        d.tick(source, now_ns);
        d
    }

    /// Reload the view if it is time.
    pub(crate) fn tick(&mut self, source: &dyn ConfigSource, now_ns: u64) {
        if now_ns < self.next_reload_ns {
            return;
        }
        self.next_reload_ns = now_ns + DESK_RELOAD_NS;
        if let Ok(c) = source.fetch() {
            self.view = Some(c);
        }
    }

    pub(crate) fn view(&self) -> Option<&Config> {
        self.view.as_deref()
    }
}

/// A removed server on its way back.
pub(crate) struct Rejoining {
    pub(crate) node: NodeId,
    /// `None` until a CM answered its first join.
    pub(crate) wait: Option<MembershipWait>,
    /// Asking the CMs (no CM answered yet), or reading the configuration.
    pub(crate) asking: bool,
    /// When it next asks or reads.
    pub(crate) next_ns: u64,
    /// When it was restarted.
    pub(crate) since_ns: u64,
    /// Joins answered.
    pub(crate) answered: u32,
    /// Its pool's identity record, as read when it was restarted, and what
    /// the signs of a removal it met since did to it
    /// ([`rowankv_deploy::join::Restart`]).
    pub(crate) restart: Restart,
}

/// What a CM's join desk answered a server: as `rowankv_deploy::join::JoinAnswer`
/// (`added`, `term`), and how, for the run's log.
pub(crate) struct Answer {
    pub(crate) added: bool,
    pub(crate) term: u64,
    pub(crate) how: String,
}
