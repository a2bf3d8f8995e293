//! Joining a cluster: a server process asks a CM for its node identity (or
//! tells it the one its pool records) before it attaches to the fabric.
//!
//! The exchange is one connection-manager request to the CM's [`JOIN_SERVICE`]
//! (`to_node` any: the caller knows only the CM's address, and has no node
//! yet), its private data carrying the request and the answer, JSON, at most
//! 256 bytes each (`docs/format/connection-manager.md`):
//!
//! - request: `{"node": u32 or null, "address": "host:port", "workers": u16}` —
//!   `node` is the identity the server's pool records, `null` for a new pool;
//!   `address` is where its connection manager listens (what the configuration
//!   will carry);
//! - answer: `{"node": u32, "lease_ms": u64, "strategy": "rowan", "added": true}`
//!   (`added` only when the CM adds the server to a running cluster) — the
//!   identity to use, the cluster's server lease and replication strategy (the
//!   server takes both from the CM, so that they cannot differ from what the
//!   CM counts on).
//!
//! A CM refuses an identity it never handed out (another cluster's pool, or a
//! store that was reset), and one that left the cluster (below), with the
//! reason: final. A standby CM answers a join into a running cluster
//! `standby: join: ...` (`crate::cm::STANDBY`), and a CM whose coordination
//! store failed `unavailable: join: ...` (`crate::cm::UNAVAILABLE`): not
//! final, the server asks the next CM, and so on until one answers. An answer
//! is not yet membership: a server the configuration does not hold a while
//! later asks again (`crate::server::rejoin_after`).
//!
//! Leaving: `rowankv leave NODE` asks every CM it knows at [`LEAVE_SERVICE`],
//! private data `{"node": u32}`, answered `{"node": u32}`. Each CM records in
//! the node's record that it left (so it never joins again) and hands it to its
//! CM role; the active one removes it from the configuration
//! (`rowankv_cm::role::CmTask::with_leaves`). The server learns it when its
//! lease is refused, tries to join again, is refused as [`LEFT`], and exits.

use std::time::{Duration, Instant};

use rowankv_fabric::QpAddr;
use rowankv_rpc::directory::Directory;
use rowankv_types::{NodeId, QpNum, Term};
use rowankv_wire::config::Config;
use serde::{Deserialize, Serialize};

use crate::ProcessError;

/// The CM's service that hands out identities.
pub const JOIN_SERVICE: u16 = u16::MAX - 3;

/// What a joining server says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub node: Option<u32>,
    pub address: String,
    pub workers: u16,
    /// Where its Redis front end is reached (`host:port`), if it runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resp: Option<String>,
}

/// What the CM answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinAnswer {
    pub node: u32,
    pub lease_ms: u64,
    pub strategy: String,
    /// The CM adds the server to a running cluster's configuration (it was
    /// not a member): the server logs it. What it does with its pool it
    /// decides from the configuration it becomes a member of
    /// ([`MembershipWait`]), not from this.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub added: bool,
    /// The term of the configuration the answer was decided on (the CM's
    /// join desk reads it every 50 ms, so it may lag): a server whose pool
    /// records membership of this term or a newer one knows `added` came
    /// from a stale view ([`removal_is_news`]). 0: unknown (a CM of the
    /// previous version, or no configuration yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub term: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether a membership the CM `added` (`Member::added`, the term of the
/// configuration that added the server) is newer than the newest
/// configuration the server was a member of when it last came up on its pool
/// (`member_term`): then the CM removed it and added it again while it was
/// down, and the pool predates the removal, whatever news of it reached the
/// server. 0 on either side: unknown, decided by the stale mark alone.
pub fn readded_since(added: u64, member_term: u64) -> bool {
    added > 0 && member_term > 0 && added > member_term
}

/// Whether a sign that the CM removed this server — a join answer that adds
/// it, decided on the configuration of `sign_term`, or a configuration of
/// `sign_term` that lacks it — is news: only if that configuration is newer
/// than the newest one the server was a member of when it last came up on its
/// pool (`member_term`, `rowankv_engine::member_term`). An older one is a
/// lagging CM's view, from before the server was (re)added: believing it
/// would mark a pool stale, and format it, that the CM may count as a full
/// replica. A sign of unknown term (0) is believed, as before terms were
/// recorded.
pub fn removal_is_news(sign_term: u64, member_term: u64) -> bool {
    sign_term == 0 || sign_term > member_term
}

/// What a restarting server's pool records of its identity
/// (`rowankv_engine::identity`), as plain values. A pool that records no
/// identity (new, or formatted) has none: `None` where one is taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolRecord {
    /// The stale mark (`rowankv_engine::marked_stale`).
    pub marked: bool,
    /// The member term (`rowankv_engine::member_term`; 0: none recorded).
    pub member_term: u64,
}

/// What a server coming back on its pool does with it once it is a member
/// ([`restart_decision`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The pool records no identity (a new server): it is formatted.
    New,
    /// The pool is recovered. `clear_mark`: it is marked stale, but the
    /// configuration counts the server as a full replica of some shard (its
    /// pool holds data no other replica may hold, whatever a stale view made
    /// it think): the mark is cleared first.
    Recover { clear_mark: bool },
    /// The CM removed the server while it was down: its pool is formatted,
    /// and it is filled again as a joining backup. `marked`: the pool is
    /// marked stale (and the configuration counts it a full replica of no
    /// shard); `readded`: its membership was added after the pool last came
    /// up as a member ([`readded_since`]).
    Format { marked: bool, readded: bool },
}

impl Decision {
    /// Whether the pool is recovered (else formatted).
    pub fn recovers(self) -> bool {
        matches!(self, Decision::Recover { .. })
    }
}

/// What a server coming back on its pool, now a member, does with the pool:
/// `record` as the pool records it now (the stale mark as this start left it,
/// the member term as the pool recorded it when the process started),
/// `full_replica` whether the configuration it is a member of counts it as a
/// full replica of some shard ([`full_replica`]), `added` its `Member::added`
/// there. Pure: the caller clears the mark, recovers or formats as told, and
/// then records the configuration's term as the pool's member term before the
/// server serves or is filled (`rowankv_engine::record_member_term`).
///
/// A pool marked stale is formatted unless the configuration counts the
/// server a full replica; a membership added after the pool last came up
/// (the CM removed and re-added it while it was down, whatever news of it
/// reached the server) makes the pool stale whatever the configuration
/// counts it (such a membership never came up on this pool); an unmarked pool
/// (a member all along) is recovered.
pub fn restart_decision(record: Option<PoolRecord>, full_replica: bool, added: u64) -> Decision {
    let Some(r) = record else {
        return Decision::New;
    };
    let readded = readded_since(added, r.member_term);
    if (r.marked && !full_replica) || readded {
        Decision::Format {
            marked: r.marked,
            readded,
        }
    } else {
        Decision::Recover {
            clear_mark: r.marked,
        }
    }
}

/// A sign, read on a server's way back, that the CM may have removed it
/// while it was down, as [`Restart`] judges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sign {
    /// No sign of a removal (an answer that does not add the server, a
    /// configuration that holds it).
    None,
    /// A sign from a configuration no newer than the pool's member term: a
    /// lagging CM's view, not news ([`removal_is_news`]).
    Lagging,
    /// News of a removal. `mark`: the pool must be marked stale now,
    /// persisted before anything else (it records an identity and is not
    /// marked yet).
    News { mark: bool },
}

/// A server's way back on its pool, from its join answer to its membership,
/// with no I/O (the server process drives it with its pool and its CMs, the
/// simulator with its own): which signs of a removal mark the pool stale
/// ([`removal_is_news`] against the pool's member term), the term older
/// configurations than which are not taken for a membership
/// ([`MembershipWait::not_before`]), and, once a member, what becomes of the
/// pool ([`restart_decision`]).
#[derive(Clone, Debug)]
pub struct Restart {
    record: Option<PoolRecord>,
    floor: u64,
    ignore_member_term: bool,
}

impl Restart {
    /// A server whose pool records `record` as the process starts.
    pub fn new(record: Option<PoolRecord>) -> Restart {
        Restart {
            record,
            floor: record.map_or(0, |r| r.member_term),
            ignore_member_term: false,
        }
    }

    /// A deliberately broken decision, for the simulator's planted bug: the
    /// member term is ignored (every sign of a removal is news, and a
    /// membership added again after the pool last came up is not noticed),
    /// as before it was recorded — a joining backup restarted within its
    /// lease and answered by a lagging CM formats a pool the CM may count
    /// as a full replica.
    pub fn unsafe_ignore_member_term(mut self) -> Restart {
        self.ignore_member_term = true;
        self.floor = 0;
        self
    }

    fn judge(&mut self, removal: bool, term: u64) -> Sign {
        let member_term = self.record.map_or(0, |r| r.member_term);
        if !removal {
            Sign::None
        } else if self.ignore_member_term || removal_is_news(term, member_term) {
            let mark = self.record.is_some_and(|r| !r.marked);
            if let Some(r) = &mut self.record {
                r.marked = true;
            }
            Sign::News { mark }
        } else {
            Sign::Lagging
        }
    }

    /// The CM's join answer: whether it `added` the server, decided on the
    /// configuration of `term`. News of a removal also raises
    /// [`Restart::not_before`] to `term`.
    pub fn answered(&mut self, added: bool, term: u64) -> Sign {
        let sign = self.judge(added, term);
        if matches!(sign, Sign::News { .. }) {
            self.floor = self.floor.max(term);
        }
        sign
    }

    /// A configuration of `term` read while waiting to be a member; `holds`:
    /// whether it holds the server.
    pub fn read(&mut self, term: u64, holds: bool) -> Sign {
        self.judge(!holds, term)
    }

    /// Configurations older than this are not taken for a membership
    /// ([`MembershipWait::not_before`]).
    pub fn not_before(&self) -> Term {
        Term(self.floor)
    }

    /// The pool's record as this start leaves it so far (marks included).
    pub fn record(&self) -> Option<PoolRecord> {
        self.record
    }

    /// Once a member: what becomes of the pool ([`restart_decision`]).
    pub fn decide(&self, full_replica: bool, added: u64) -> Decision {
        let record = if self.ignore_member_term {
            self.record.map(|r| PoolRecord {
                member_term: 0,
                ..r
            })
        } else {
            self.record
        };
        restart_decision(record, full_replica, added)
    }
}

/// The CM's service that removes a server on purpose.
pub const LEAVE_SERVICE: u16 = u16::MAX - 4;

/// What `rowankv leave` asks, and what the CM answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaveRequest {
    pub node: u32,
}

/// How a CM's refusal of a server that left begins (after `refused: join: `).
pub const LEFT: &str = "left: ";

/// The node a joining process names as itself before it has one.
pub const UNJOINED: NodeId = NodeId(u32::MAX - 1);

/// Ask the CMs (`cms`, aliases in `directory`), each in turn until one answers,
/// for up to `patience`.
pub fn join(
    directory: &Directory,
    cms: &[NodeId],
    request: &JoinRequest,
    patience: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<JoinAnswer, ProcessError> {
    let private = serde_json::to_vec(request).expect("a request serializes");
    let deadline = Instant::now() + patience;
    let mut last = String::from("no CM was asked");
    let mut round = 0u32;
    loop {
        for &cm in cms {
            let from = QpAddr {
                node: UNJOINED,
                qpn: QpNum(0),
            };
            let answer = directory
                .request(cm, JOIN_SERVICE, from, private.clone())
                .map_err(|e| e.to_string())
                .and_then(|rx| {
                    rx.recv_timeout(Duration::from_secs(15))
                        .map_err(|_| "no answer".to_string())?
                });
            match answer {
                Ok(a) => {
                    return serde_json::from_slice(&a.private)
                        .map_err(|e| ProcessError(format!("a malformed join answer: {e}")))
                }
                // A refusal with a reason (not "cannot connect") is final; a
                // standby CM's answer sends the server to the next CM.
                Err(why) if why.starts_with("refused: join") => {
                    return Err(ProcessError(format!("the CM refused the join: {why}")))
                }
                Err(why) => last = why,
            }
        }
        round += 1;
        if Instant::now() > deadline || stop() {
            return Err(ProcessError(format!(
                "no CM answered the join within {patience:?}: {last}"
            )));
        }
        if round == 1 || round.is_multiple_of(20) {
            tracing::info!(why = %last, "waiting for a CM to answer the join");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A joined server's wait to be a member of the configuration, with no I/O
/// and no clock of its own (the server process drives it with real time, the
/// simulator with its own): a join answered is not yet a join carried out, so
/// a server still not a member `rejoin_after` after it last asked asks again.
///
/// With the membership it reports whether the configuration counts the server
/// as a full replica of some shard (a primary, or a backup that is not
/// joining). A server whose pool is marked stale (`rowankv_engine::mark_stale`:
/// it saw that the CM removed it while it was down) formats it unless so: a
/// full replica's pool holds data no other replica may hold, whatever a stale
/// view made it think, while a joining backup's stale pool would keep what
/// the primaries' fill does not overwrite (they install only newer entries: a
/// key deleted since would come back). Configurations older than one already
/// read are ignored.
#[derive(Clone, Debug)]
pub struct MembershipWait {
    node: NodeId,
    rejoin_after_ns: u64,
    asked_ns: u64,
    newest: Term,
}

/// What a server waiting to be a member does after reading a configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Awaited {
    /// It is a member; `full_replica`: the configuration counts it as a full
    /// replica of some shard ([`full_replica`]).
    Member { full_replica: bool },
    /// Not yet: read again.
    Wait,
    /// Not yet, for `rejoin_after`: ask the CMs again, then [`MembershipWait::asked`].
    AskAgain,
}

impl MembershipWait {
    /// `node` was answered to a join at `now_ns`.
    pub fn new(node: NodeId, rejoin_after: Duration, now_ns: u64) -> Self {
        MembershipWait {
            node,
            rejoin_after_ns: rejoin_after.as_nanos() as u64,
            asked_ns: now_ns,
            newest: Term(0),
        }
    }

    /// Configurations older than `term` are ignored from the start: the
    /// server knows one at least that new (its pool's member term, or a
    /// removal it believed).
    pub fn not_before(mut self, term: Term) -> Self {
        self.newest = self.newest.max(term);
        self
    }

    /// A configuration read at `now_ns`.
    pub fn read(&mut self, config: &Config, now_ns: u64) -> Awaited {
        let stale = config.term < self.newest;
        self.newest = self.newest.max(config.term);
        if !stale && config.member(self.node).is_some() {
            Awaited::Member {
                full_replica: full_replica(config, self.node),
            }
        } else if now_ns.saturating_sub(self.asked_ns) >= self.rejoin_after_ns {
            Awaited::AskAgain
        } else {
            Awaited::Wait
        }
    }

    /// The CMs were asked again at `now_ns`.
    pub fn asked(&mut self, now_ns: u64) {
        self.asked_ns = now_ns;
    }
}

/// Whether `config` counts `node` as a full replica of some shard: its
/// primary, or a backup that is not joining.
pub fn full_replica(config: &Config, node: NodeId) -> bool {
    // `joining` is a list of its own, apart from `backups`.
    config
        .shards
        .iter()
        .any(|s| s.primary == node || s.backups.contains(&node))
}

/// Whether a join failed because the server left the cluster.
pub fn refused_as_left(e: &ProcessError) -> bool {
    e.0.contains(&format!("refused: join: {LEFT}"))
}

/// Ask the CMs (`cms`, aliases in `directory`), on behalf of the client `me`, to
/// remove `node`: every CM that answers records it; the answers' count is
/// returned (at least one, or an error with the last reason).
pub fn leave(
    directory: &Directory,
    cms: &[NodeId],
    me: NodeId,
    node: NodeId,
) -> Result<usize, ProcessError> {
    let private = serde_json::to_vec(&LeaveRequest { node: node.0 }).expect("serializes");
    let mut answered = 0;
    let mut last = String::from("no CM was asked");
    for &cm in cms {
        let from = QpAddr {
            node: me,
            qpn: QpNum(0),
        };
        let answer = directory
            .request(cm, LEAVE_SERVICE, from, private.clone())
            .map_err(|e| e.to_string())
            .and_then(|rx| {
                rx.recv_timeout(Duration::from_secs(15))
                    .map_err(|_| "no answer".to_string())?
            });
        match answer {
            Ok(_) => answered += 1,
            Err(why) if why.starts_with("refused: leave") => {
                return Err(ProcessError(format!("the CM refused: {why}")))
            }
            Err(why) => last = why,
        }
    }
    if answered == 0 {
        return Err(ProcessError(format!("no CM answered: {last}")));
    }
    Ok(answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_messages_fit_the_private_data_and_refuse_unknown_fields() {
        let r = JoinRequest {
            node: Some(u32::MAX - 2),
            address: format!("{}:65535", "h".repeat(80)),
            workers: 255,
            resp: Some(format!("{}:65535", "h".repeat(80))),
        };
        let bytes = serde_json::to_vec(&r).unwrap();
        assert!(bytes.len() <= rowankv_rpc::directory::PRIVATE_BYTES_MAX);
        assert_eq!(serde_json::from_slice::<JoinRequest>(&bytes).unwrap(), r);
        assert!(serde_json::from_str::<JoinRequest>(
            r#"{"node":null,"address":"a:1","workers":1,"extra":1}"#
        )
        .is_err());
        for (added, term) in [(false, 0), (true, 17)] {
            let a = JoinAnswer {
                node: 10_000,
                lease_ms: 200,
                strategy: "rowan".into(),
                added,
                term,
            };
            let bytes = serde_json::to_vec(&a).unwrap();
            assert!(bytes.len() <= rowankv_rpc::directory::PRIVATE_BYTES_MAX);
            assert_eq!(serde_json::from_slice::<JoinAnswer>(&bytes).unwrap(), a);
        }
        // An answer without the field (a CM of the previous version) adds nothing.
        let old: JoinAnswer =
            serde_json::from_str(r#"{"node":1,"lease_ms":200,"strategy":"rowan"}"#).unwrap();
        assert!(!old.added);
        assert_eq!(old.term, 0, "an answer of unknown term");
    }

    fn pool(marked: bool, member_term: u64) -> Option<PoolRecord> {
        Some(PoolRecord {
            marked,
            member_term,
        })
    }

    /// The decision `rowankv server` takes once a member, in every case.
    #[test]
    fn the_restart_decision_formats_only_a_pool_the_cm_removed() {
        assert_eq!(restart_decision(None, false, 0), Decision::New);
        assert_eq!(restart_decision(None, true, 9), Decision::New);
        // A member all along: recovered, as a joining backup or a full replica.
        for full in [false, true] {
            assert_eq!(
                restart_decision(pool(false, 5), full, 5),
                Decision::Recover { clear_mark: false }
            );
        }
        // Marked stale: formatted, unless counted a full replica.
        assert_eq!(
            restart_decision(pool(true, 5), false, 5),
            Decision::Format {
                marked: true,
                readded: false
            }
        );
        assert_eq!(
            restart_decision(pool(true, 5), true, 3),
            Decision::Recover { clear_mark: true }
        );
        // Added again after the pool last came up: formatted, whatever the
        // marks and the configuration say.
        for (marked, full) in [(false, false), (false, true), (true, true)] {
            assert_eq!(
                restart_decision(pool(marked, 5), full, 9),
                Decision::Format {
                    marked,
                    readded: true
                }
            );
        }
        // No member term recorded: the marks alone decide.
        assert!(restart_decision(pool(false, 0), false, 9).recovers());
    }

    /// A joining backup that came up at term 5 (its fill may have
    /// completed), restarted within its lease: a lagging CM's answer (term 4)
    /// that adds it, and a lagging configuration that lacks it, are no news,
    /// and its pool is recovered as it comes back a joining backup; news from
    /// term 6 marks it once (persisted by the caller) and formats it. The
    /// planted bug believes the lagging answer and formats the pool.
    #[test]
    fn a_restart_marks_the_pool_only_on_news_newer_than_its_member_term() {
        let mut r = Restart::new(pool(false, 5));
        assert_eq!(r.not_before(), Term(5));
        assert_eq!(r.answered(true, 4), Sign::Lagging);
        assert_eq!(r.read(5, false), Sign::Lagging);
        assert_eq!(r.read(5, true), Sign::None);
        assert_eq!(r.not_before(), Term(5));
        assert_eq!(r.record(), pool(false, 5));
        assert_eq!(r.decide(false, 5), Decision::Recover { clear_mark: false });

        let mut r = Restart::new(pool(false, 5));
        assert_eq!(r.answered(true, 6), Sign::News { mark: true });
        assert_eq!(r.not_before(), Term(6));
        assert_eq!(r.read(7, false), Sign::News { mark: false }, "marked once");
        assert_eq!(r.record(), pool(true, 5));
        assert!(!r.decide(false, 8).recovers());
        assert_eq!(r.decide(true, 3), Decision::Recover { clear_mark: true });

        // Already marked by an earlier start: no second mark.
        let mut r = Restart::new(pool(true, 5));
        assert_eq!(r.answered(false, 0), Sign::None);
        assert_eq!(r.read(6, false), Sign::News { mark: false });
        // No identity recorded: news, but nothing to mark.
        let mut r = Restart::new(None);
        assert_eq!(r.answered(true, 3), Sign::News { mark: false });
        assert_eq!(r.not_before(), Term(3));
        assert_eq!(r.decide(false, 4), Decision::New);

        let mut broken = Restart::new(pool(false, 5)).unsafe_ignore_member_term();
        assert_eq!(broken.answered(true, 4), Sign::News { mark: true });
        assert!(!broken.decide(false, 5).recovers());
        let broken = Restart::new(pool(false, 5)).unsafe_ignore_member_term();
        assert!(broken.decide(false, 9).recovers(), "re-adding unnoticed");
    }
}
