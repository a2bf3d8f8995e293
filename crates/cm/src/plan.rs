//! Planning the next configuration (seed 000 §4.5 phase 1 and phase 3).
//!
//! [`plan_failover`] removes failed servers: the term moves on, each shard that
//! lost its primary gets one of its backups as the new primary (never a joining
//! backup, which may not hold the whole shard yet), every shard that lost a
//! replica gets a replacement *joining* backup from the servers that do not hold
//! it yet, least-loaded first, so that re-replication restores the replication
//! factor. With too few servers left a shard runs degraded (fewer backups).
//! [`plan_ready`] turns a joining backup whose copy is complete into a backup;
//! [`plan_move`] moves a backup to another server (rebalancing).
//!
//! All are pure functions of the current configuration, so every CM — the
//! active one, or a standby that takes over halfway — computes the same plan.

use std::collections::BTreeMap;

use rowankv_types::{NodeId, ShardId, Term};
use rowankv_wire::config::{Config, Member};

use crate::manager::CmError;

/// The configuration after `failed` servers are removed.
///
/// `CmError::Invalid` if a shard would lose every replica that holds all of it
/// (its primary and every full backup failed): no promotion can keep its data.
pub fn plan_failover(current: &Config, failed: &[NodeId]) -> Result<Config, CmError> {
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    next.members.retain(|m| !failed.contains(&m.node));
    if next.members.is_empty() {
        return Err(CmError::Invalid("every server failed".into()));
    }
    for s in &mut next.shards {
        s.backups.retain(|b| !failed.contains(b));
        s.joining.retain(|b| !failed.contains(b));
        if failed.contains(&s.primary) {
            if s.backups.is_empty() {
                return Err(CmError::Invalid(format!(
                    "{} lost its primary {} and every full backup",
                    s.shard, s.primary
                )));
            }
            s.primary = s.backups.remove(0);
        }
    }
    refill(&mut next);
    next.validate()
        .map_err(|e| CmError::Invalid(format!("planned configuration: {e}")))?;
    Ok(next)
}

/// Give every shard with fewer than `replication_factor - 1` backups a joining
/// one, from the members that hold the fewest replicas (ties: lowest node id).
fn refill(config: &mut Config) {
    let wanted = (config.replication_factor as usize).saturating_sub(1);
    let mut load: BTreeMap<NodeId, usize> = config.members.iter().map(|m| (m.node, 0)).collect();
    for s in &config.shards {
        for n in std::iter::once(s.primary).chain(s.write_targets()) {
            *load.entry(n).or_default() += 1;
        }
    }
    for s in &mut config.shards {
        while s.write_target_count() < wanted {
            let pick = load
                .iter()
                .filter(|(n, _)| !s.is_replica(**n))
                .min_by_key(|(n, l)| (**l, **n))
                .map(|(n, _)| *n);
            let Some(n) = pick else { break };
            s.joining.push(n);
            *load.get_mut(&n).expect("a member") += 1;
        }
    }
}

/// The configuration after `node` finished copying `shard`: `node` moves from the
/// shard's joining backups to its backups. `None` if it is not joining there
/// (already done, or removed by a failover since).
pub fn plan_ready(current: &Config, shard: ShardId, node: NodeId) -> Option<Config> {
    let s = current.shard(shard)?;
    if !s.joining.contains(&node) {
        return None;
    }
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    let s = &mut next.shards[shard.0 as usize];
    s.joining.retain(|&n| n != node);
    s.backups.push(node);
    Some(next)
}

/// The configuration after an operator moves `shard`'s backup `from` to `to`
/// (rebalancing): `from` leaves the shard's backups, `to` joins it and is
/// copied, then made a full backup by [`plan_ready`]. `None` if that is not a
/// move now: `from` is not a full backup of the shard, `to` is not a member
/// or already holds the shard, or a shard is still joining a backup (one
/// reconfiguration at a time).
pub fn plan_move(current: &Config, shard: ShardId, from: NodeId, to: NodeId) -> Option<Config> {
    let s = current.shard(shard)?;
    if !s.backups.contains(&from)
        || s.is_replica(to)
        || !current.members.iter().any(|m| m.node == to)
        || current.shards.iter().any(|a| !a.joining.is_empty())
    {
        return None;
    }
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    let s = &mut next.shards[shard.0 as usize];
    s.backups.retain(|&b| b != from);
    s.joining.push(to);
    Some(next)
}

/// The configuration after `member` joins (a new server, or one that was
/// removed and came back with its identity): it becomes a member, and a
/// joining backup of every shard that has fewer replicas than the replication
/// factor asks (from the least loaded members, as after a failover). `None` if
/// it already is a member.
pub fn plan_join(current: &Config, member: Member) -> Option<Config> {
    if current.member(member.node).is_some() {
        return None;
    }
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    let mut member = member;
    member.added = next.term.0;
    next.members.push(member);
    next.members.sort_by_key(|m| m.node);
    refill(&mut next);
    next.validate().ok()?;
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_joins_refills_the_shards_a_failover_left_short() {
        let c = config(3, 2, 3);
        let short = plan_failover(&c, &[NodeId(2)]).unwrap();
        // Two members left: every shard is one replica short, nothing to refill from.
        assert!(short
            .shards
            .iter()
            .all(|s| s.write_target_count() == 1 && s.joining.is_empty()));
        let back = Member {
            added: 0,
            node: NodeId(2),
            workers: 2,
            address: Some("h:1".into()),
            resp: None,
        };
        let next = plan_join(&short, back.clone()).unwrap();
        assert_eq!(next.term, Term(short.term.0 + 1));
        // The member records the term that added it.
        assert_eq!(
            next.member(NodeId(2)),
            Some(&Member {
                added: next.term.0,
                ..back.clone()
            })
        );
        for s in &next.shards {
            assert_eq!(s.joining, vec![NodeId(2)], "{s:?}");
            assert_eq!(s.write_target_count(), 2);
        }
        assert!(plan_join(&next, back).is_none(), "already a member");
        // A cluster at full strength gains a member and moves nothing.
        let extra = Member {
            added: 0,
            node: NodeId(7),
            workers: 1,
            address: None,
            resp: None,
        };
        let grown = plan_join(&c, extra).unwrap();
        assert_eq!(grown.members.len(), 4);
        assert_eq!(grown.shards, c.shards);
    }

    fn config(servers: u32, per_server: u16, rf: u8) -> Config {
        let members: Vec<Member> = (0..servers)
            .map(|i| Member {
                added: 0,
                node: NodeId(i),
                workers: 2,
                address: None,
                resp: None,
            })
            .collect();
        Config::initial(9, &members, per_server, rf).unwrap()
    }

    #[test]
    fn a_failed_primary_is_replaced_by_its_first_backup() {
        let c = config(4, 2, 3);
        let next = plan_failover(&c, &[NodeId(1)]).unwrap();
        assert_eq!(next.term, Term(2));
        assert!(next.member(NodeId(1)).is_none());
        for (before, after) in c.shards.iter().zip(&next.shards) {
            assert!(!after.is_replica(NodeId(1)), "{after:?}");
            if before.primary == NodeId(1) {
                assert_eq!(after.primary, before.backups[0], "first backup promoted");
            } else {
                assert_eq!(after.primary, before.primary, "primaries that lived stay");
            }
            // Four servers, RF 3: a replacement joins wherever a replica was lost.
            assert_eq!(after.write_target_count(), 2, "{after:?}");
            if before.is_replica(NodeId(1)) {
                assert_eq!(after.joining.len(), 1, "{after:?}");
            } else {
                assert!(after.joining.is_empty());
            }
        }
        next.validate().unwrap();
    }

    #[test]
    fn with_too_few_servers_shards_run_degraded() {
        let c = config(3, 2, 3);
        let next = plan_failover(&c, &[NodeId(0)]).unwrap();
        for s in &next.shards {
            assert_eq!(s.write_target_count(), 1, "{s:?}");
            assert!(s.joining.is_empty());
        }
        // A second failure leaves one server holding everything.
        let last = plan_failover(&next, &[NodeId(1)]).unwrap();
        assert!(last.shards.iter().all(|s| s.primary == NodeId(2)));
    }

    #[test]
    fn a_joining_backup_is_never_promoted() {
        let c = config(4, 1, 3);
        let mid = plan_failover(&c, &[NodeId(3)]).unwrap();
        let s = mid.shards.iter().find(|s| !s.joining.is_empty()).unwrap();
        let (shard, joining) = (s.shard, s.joining[0]);
        // Fail the primary and the only full backup: the joining copy is partial.
        let mut doomed = vec![s.primary];
        doomed.extend(&s.backups);
        let err = plan_failover(&mid, &doomed).unwrap_err();
        assert!(err.to_string().contains("every full backup"), "{err}");
        // Once ready, it counts.
        let ready = plan_ready(&mid, shard, joining).unwrap();
        assert!(ready.shard(shard).unwrap().backups.contains(&joining));
        assert_eq!(plan_ready(&ready, shard, joining), None, "ready once");
    }

    #[test]
    fn replacements_spread_over_the_least_loaded() {
        let c = config(5, 4, 3);
        let next = plan_failover(&c, &[NodeId(2)]).unwrap();
        let mut joins: BTreeMap<NodeId, usize> = BTreeMap::new();
        for s in &next.shards {
            for &j in &s.joining {
                *joins.entry(j).or_default() += 1;
            }
        }
        let (min, max) = (
            joins.values().min().copied().unwrap_or(0),
            joins.values().max().copied().unwrap_or(0),
        );
        assert!(max - min <= 2, "joins spread evenly: {joins:?}");
    }

    #[test]
    fn a_move_swaps_a_backup_for_a_joining_one_and_refuses_what_is_not_a_move() {
        let c = config(4, 1, 3);
        let s = c.shards[0].clone();
        let from = s.backups[0];
        let to = c
            .members
            .iter()
            .map(|m| m.node)
            .find(|n| !s.is_replica(*n))
            .unwrap();
        let next = plan_move(&c, s.shard, from, to).unwrap();
        assert_eq!(next.term, Term(c.term.0 + 1));
        let t = &next.shards[0];
        assert!(!t.backups.contains(&from) && t.joining == vec![to]);
        assert!(next.validate().is_ok());
        // Not a move: the primary as `from`, a replica as `to`, a second move
        // while one is joining.
        assert!(plan_move(&c, s.shard, s.primary, to).is_none());
        assert!(plan_move(&c, s.shard, from, s.primary).is_none());
        assert!(plan_move(&next, next.shards[1].shard, next.shards[1].backups[0], to).is_none());
        // Once copied, the joining backup becomes a full one.
        let done = plan_ready(&next, s.shard, to).unwrap();
        assert!(done.shards[0].backups.contains(&to) && done.shards[0].joining.is_empty());
    }
}
