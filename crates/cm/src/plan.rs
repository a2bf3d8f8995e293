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
//! [`plan_reshard`] moves the hottest primary shards of overloaded servers to
//! underloaded ones (dynamic resharding, §4.6), recording each move in the
//! configuration's migration list; [`plan_migrated`] strikes a finished one.
//! A failover rolls back every migration its failed servers take part in
//! before it promotes (§4.6: "the CM first rolls back the shard distribution").
//!
//! All are pure functions of the current configuration, so every CM — the
//! active one, or a standby that takes over halfway — computes the same plan.

use std::collections::BTreeMap;

use rowankv_types::{NodeId, ShardId, Term};
use rowankv_wire::config::{Config, Member, Migration};

use crate::manager::CmError;

/// The configuration after `failed` servers are removed.
///
/// `CmError::Invalid` if a shard would lose every replica that holds all of it
/// (its primary and every full backup failed): no promotion can keep its data.
pub fn plan_failover(current: &Config, failed: &[NodeId]) -> Result<Config, CmError> {
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    // An interrupted migration rolls back (§4.6): the shard's first full
    // backup is promoted, as when a primary fails. Neither end of the move
    // may lead it again: the target may lack entries not copied yet, and the
    // source lacks every write the target acknowledged since the hand-over
    // — the backups hold them all (every write of either went to them).
    // Both ends are left out of the shard's replicas; the refill below gives
    // it its backup back. (With no backup, the source leads again: a shard
    // of replication factor 1 has no other copy of its older entries.)
    let interrupted: Vec<Migration> = next
        .migrations
        .iter()
        .filter(|m| failed.contains(&m.from) || failed.contains(&m.to))
        .copied()
        .collect();
    for m in &interrupted {
        let s = &mut next.shards[m.shard.0 as usize];
        s.primary = if s.backups.iter().any(|b| !failed.contains(b)) {
            let at = s
                .backups
                .iter()
                .position(|b| !failed.contains(b))
                .expect("checked");
            s.backups.remove(at)
        } else {
            m.from
        };
    }
    next.migrations.retain(|m| !interrupted.contains(m));
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
    // A migration's source still holds the shard's data and is not a replica.
    let sources: Vec<(ShardId, NodeId)> = config
        .migrations
        .iter()
        .map(|m| (m.shard, m.from))
        .collect();
    for s in &mut config.shards {
        while s.write_target_count() < wanted {
            let pick = load
                .iter()
                .filter(|(n, _)| !s.is_replica(**n) && !sources.contains(&(s.shard, **n)))
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
        || current.migration(shard).is_some_and(|m| m.from == to)
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

/// What a shard cost in one statistics window (§4.6: 500 ms): the requests
/// its primary received, and the replication writes it sent to each backup
/// (a backup's CPU may never see them, so the primary counts them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardLoad {
    pub requests: u64,
    pub replication_writes: u64,
}

/// When [`plan_reshard`] acts and where it stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReshardPolicy {
    /// A server is overloaded above `(1 + overload) ×` the average load
    /// (paper: 30 %).
    pub overload: f64,
    /// Moves go on until every server is within `(1 + within) ×` the average
    /// (paper: 5 %), or no move helps.
    pub within: f64,
}

impl Default for ReshardPolicy {
    fn default() -> Self {
        ReshardPolicy {
            overload: 0.30,
            within: 0.05,
        }
    }
}

/// Each member's load: the requests of the shards it leads plus the
/// replication writes of the shards it backs (joining or not). Members with
/// no shard count 0; shards missing from `loads` count 0.
pub fn server_loads(
    config: &Config,
    loads: &BTreeMap<ShardId, ShardLoad>,
) -> BTreeMap<NodeId, u64> {
    let mut out: BTreeMap<NodeId, u64> = config.members.iter().map(|m| (m.node, 0)).collect();
    for s in &config.shards {
        let l = loads.get(&s.shard).copied().unwrap_or_default();
        *out.entry(s.primary).or_default() += l.requests;
        for b in s.write_targets() {
            *out.entry(b).or_default() += l.replication_writes;
        }
    }
    out
}

/// Dynamic resharding (§4.6): if a member's load is more than `policy.overload`
/// above the average, move primary shards off the most loaded member, one at a
/// time, each to the least loaded member that holds no replica of it (a
/// member is a source or a target of a plan, never both), choosing
/// the move that leaves the pair's larger load smallest and taking only moves
/// that lower the source's load below where it was — until every member is
/// within `policy.within` of the average or no move helps. Every move goes into
/// the migration list (⟨source, target, shard⟩) and names the target as the
/// shard's primary; its backups stay. `None` if nothing is overloaded, nothing
/// can move, or a reconfiguration is under way (a migration, a joining backup:
/// one at a time). A shard moves at most once per plan.
pub fn plan_reshard(
    current: &Config,
    loads: &BTreeMap<ShardId, ShardLoad>,
    policy: ReshardPolicy,
) -> Option<Config> {
    if !current.migrations.is_empty() || current.shards.iter().any(|s| !s.joining.is_empty()) {
        return None;
    }
    let mut load = server_loads(current, loads);
    let total: u64 = load.values().sum();
    let average = total as f64 / load.len().max(1) as f64;
    if total == 0
        || !load
            .values()
            .any(|&l| l as f64 > average * (1.0 + policy.overload))
    {
        return None;
    }
    let requests = |s: ShardId| loads.get(&s).map_or(0, |l| l.requests);
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    for _ in 0..current.shards.len() {
        // A member is a source or a target of this plan, not both.
        let Some((&source, &source_load)) = load
            .iter()
            .filter(|(n, _)| !next.migrations.iter().any(|m| m.to == **n))
            .max_by_key(|(n, l)| (**l, std::cmp::Reverse(**n)))
        else {
            break;
        };
        if source_load as f64 <= average * (1.0 + policy.within) {
            break;
        }
        // (resulting larger load of the pair, shard, target)
        let mut best: Option<(u64, ShardId, NodeId)> = None;
        // Hottest first, so that of moves that help alike the hottest shard's
        // is taken.
        let mut candidates: Vec<_> = next
            .shards
            .iter()
            .filter(|s| s.primary == source && next.migration(s.shard).is_none())
            .collect();
        candidates.sort_by_key(|s| (std::cmp::Reverse(requests(s.shard)), s.shard));
        for s in candidates {
            let r = requests(s.shard);
            let target = load
                .iter()
                .filter(|(n, _)| {
                    !s.is_replica(**n) && !next.migrations.iter().any(|m| m.from == **n)
                })
                .min_by_key(|(n, l)| (**l, **n))
                .map(|(n, l)| (*n, *l));
            let Some((target, target_load)) = target else {
                continue;
            };
            let after = (source_load - r).max(target_load + r);
            if r > 0 && after < source_load && best.is_none_or(|(b, _, _)| after < b) {
                best = Some((after, s.shard, target));
            }
        }
        let Some((_, shard, target)) = best else {
            break;
        };
        let r = requests(shard);
        *load.get_mut(&source).expect("a member") -= r;
        *load.get_mut(&target).expect("a member") += r;
        next.shards[shard.0 as usize].primary = target;
        next.migrations.push(Migration {
            shard,
            from: source,
            to: target,
        });
    }
    if next.migrations.is_empty() {
        return None;
    }
    next.validate().ok()?;
    Some(next)
}

/// The configuration after an operator asks to move `shard`'s primary to
/// `to` (`rowankv reshard`, Redis `CLUSTER SETSLOT … NODE`): one migration
/// task. `Err` with why, if that is not a move now: the shard or member does
/// not exist, `to` already holds a replica of it, or a reconfiguration is
/// under way (a migration, a joining backup: one at a time).
pub fn plan_migrate(current: &Config, shard: ShardId, to: NodeId) -> Result<Config, String> {
    let s = current
        .shard(shard)
        .ok_or_else(|| format!("{shard} does not exist"))?;
    if current.member(to).is_none() {
        return Err(format!("{to} is not a member"));
    }
    if s.primary == to {
        return Err(format!("{to} leads {shard} already"));
    }
    if s.is_replica(to) {
        return Err(format!(
            "{to} holds a replica of {shard}: move it to a server that holds none"
        ));
    }
    if !current.migrations.is_empty() || current.shards.iter().any(|a| !a.joining.is_empty()) {
        return Err("a reconfiguration is under way (a migration or a joining backup)".into());
    }
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    next.migrations.push(Migration {
        shard,
        from: s.primary,
        to,
    });
    next.shards[shard.0 as usize].primary = to;
    next.validate()
        .map_err(|e| format!("planned configuration: {e}"))?;
    Ok(next)
}

/// The configuration after `shard`'s migration finished (its target has every
/// entry): struck from the list. `None` if it is not in the list (finished
/// already, or rolled back by a failover).
pub fn plan_migrated(current: &Config, shard: ShardId) -> Option<Config> {
    current.migration(shard)?;
    let mut next = current.clone();
    next.term = Term(current.term.0 + 1);
    next.migrations.retain(|m| m.shard != shard);
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(c: &Config, per_shard: u64) -> BTreeMap<ShardId, ShardLoad> {
        c.shards
            .iter()
            .map(|s| {
                (
                    s.shard,
                    ShardLoad {
                        requests: per_shard,
                        replication_writes: per_shard / 10,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_balanced_cluster_is_left_alone() {
        let c = config(6, 4, 3);
        assert!(plan_reshard(&c, &uniform(&c, 1000), ReshardPolicy::default()).is_none());
        assert!(plan_reshard(&c, &BTreeMap::new(), ReshardPolicy::default()).is_none());
    }

    /// Figure 15's scenario: 80 % of server A's (n0) requests go to one shard
    /// of server B (n1). Returns the loads and that shard.
    fn figure_15(c: &Config) -> (BTreeMap<ShardId, ShardLoad>, ShardId) {
        let mut loads = uniform(c, 1000);
        let a_shards: Vec<ShardId> = c.primary_shards(NodeId(0)).map(|s| s.shard).collect();
        let hot = c.primary_shards(NodeId(1)).next().unwrap().shard;
        for s in &a_shards {
            loads.get_mut(s).unwrap().requests = 200;
        }
        loads.get_mut(&hot).unwrap().requests += 4 * 800;
        (loads, hot)
    }

    /// Figure 15's scenario: the hot shard moves to the least loaded server,
    /// and the migration is listed.
    #[test]
    fn a_hot_shard_moves_off_its_overloaded_server() {
        let c = config(6, 4, 3);
        let b = NodeId(1);
        let (loads, hot) = figure_15(&c);
        let before = server_loads(&c, &loads);
        let next = plan_reshard(&c, &loads, ReshardPolicy::default()).expect("a plan");
        next.validate().unwrap();
        assert_eq!(next.term, Term(c.term.0 + 1));
        let m = next.migration(hot).copied().expect("the hot shard moves");
        assert_eq!(m.from, b);
        assert!(!c.shard(hot).unwrap().is_replica(m.to), "{m:?}");
        assert_eq!(next.shard(hot).unwrap().primary, m.to);
        assert_eq!(
            next.shard(hot).unwrap().backups,
            c.shard(hot).unwrap().backups,
            "its backups stay"
        );
        let after = server_loads(&next, &loads);
        let max = |l: &BTreeMap<NodeId, u64>| *l.values().max().unwrap();
        assert!(max(&after) < max(&before), "{before:?} -> {after:?}");
        // Only primaries moved, each listed once, from the server it left.
        for (x, y) in c.shards.iter().zip(&next.shards) {
            if x.primary != y.primary {
                let m = next.migration(x.shard).expect("listed");
                assert_eq!((m.from, m.to), (x.primary, y.primary));
            } else {
                assert!(next.migration(x.shard).is_none());
            }
        }
        // One reshard at a time.
        assert!(plan_reshard(&next, &loads, ReshardPolicy::default()).is_none());
        // The target reports the copy done: struck from the list.
        let done = plan_migrated(&next, hot).unwrap();
        assert!(done.migration(hot).is_none());
        assert_eq!(done.shard(hot).unwrap().primary, m.to);
        assert!(plan_migrated(&done, hot).is_none());
        done.validate().unwrap();
    }

    /// Wherever the planner stops, no server is more loaded than the most
    /// loaded one was; taken in order, every move lowered its source's load
    /// and left the pair's larger load below it; no member is both a source
    /// and a target.
    #[test]
    fn random_loads_never_make_the_hottest_server_hotter() {
        let c = config(6, 4, 3);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next_rand = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut planned = 0;
        for _ in 0..500 {
            let loads: BTreeMap<ShardId, ShardLoad> = c
                .shards
                .iter()
                .map(|s| {
                    let skew = if next_rand() % 8 == 0 { 20 } else { 1 };
                    (
                        s.shard,
                        ShardLoad {
                            requests: next_rand() % 1000 * skew,
                            replication_writes: next_rand() % 100,
                        },
                    )
                })
                .collect();
            let before = server_loads(&c, &loads);
            let Some(next) = plan_reshard(&c, &loads, ReshardPolicy::default()) else {
                continue;
            };
            planned += 1;
            next.validate().unwrap();
            let after = server_loads(&next, &loads);
            assert!(
                after.values().max() <= before.values().max(),
                "{before:?} -> {after:?}"
            );
            let mut now = before.clone();
            for m in &next.migrations {
                let r = loads[&m.shard].requests;
                let (from, to) = (now[&m.from] - r, now[&m.to] + r);
                assert!(from.max(to) < now[&m.from], "{m:?}: {now:?}");
                now.insert(m.from, from);
                now.insert(m.to, to);
                assert!(!next.migrations.iter().any(|x| x.to == m.from), "{m:?}");
            }
            assert_eq!(now, after);
        }
        assert!(
            planned > 50,
            "only {planned} of 500 skewed loads planned a move"
        );
    }

    /// A failure of a migration's source or target rolls the shard back to
    /// its source before the failover promotes (§4.6).
    #[test]
    fn a_failover_rolls_back_the_migrations_of_the_failed_servers() {
        let c = config(6, 4, 3);
        let (loads, hot) = figure_15(&c);
        let moving = plan_reshard(&c, &loads, ReshardPolicy::default()).unwrap();
        let m = *moving.migration(hot).unwrap();
        let first_backup = c.shard(hot).unwrap().backups[0];
        // Either end fails: the shard's first backup leads it (it holds every
        // write of both ends), and neither end is a replica of it.
        for failed in [m.to, m.from] {
            let back = plan_failover(&moving, &[failed]).unwrap();
            assert!(back
                .migrations
                .iter()
                .all(|x| x.to != failed && x.from != failed));
            assert!(back.migration(hot).is_none());
            let s = back.shard(hot).unwrap();
            assert_eq!(s.primary, first_backup, "{failed} failed");
            // The failed end is gone; the other leads nothing and backs
            // nothing in full (the refill may pick it as a joining backup:
            // its copy is then installed version-conditionally).
            assert!(!s.is_replica(failed), "{s:?}");
            assert!(s.primary != m.from && !s.backups.contains(&m.from), "{s:?}");
            assert_eq!(s.write_target_count(), 2, "refilled: {s:?}");
            back.validate().unwrap();
        }
        // Another server fails: the migration goes on.
        let other = moving
            .members
            .iter()
            .map(|x| x.node)
            .find(|n| moving.migrations.iter().all(|x| x.from != *n && x.to != *n))
            .unwrap();
        let on = plan_failover(&moving, &[other]).unwrap();
        assert_eq!(on.migration(hot), Some(&m));
    }

    /// An operator's move: one task, the target named primary; refused with
    /// why when it cannot be a move now.
    #[test]
    fn an_operator_moves_one_shard_to_a_server_that_holds_none_of_it() {
        let c = config(5, 2, 3);
        let s = c.shard(ShardId(0)).unwrap().clone();
        let to = c
            .members
            .iter()
            .map(|m| m.node)
            .find(|n| !s.is_replica(*n))
            .unwrap();
        let next = plan_migrate(&c, ShardId(0), to).unwrap();
        assert_eq!(next.term, Term(c.term.0 + 1));
        assert_eq!(
            next.migrations,
            vec![Migration {
                shard: ShardId(0),
                from: s.primary,
                to
            }]
        );
        assert_eq!(next.shard(ShardId(0)).unwrap().primary, to);
        assert_eq!(next.shard(ShardId(0)).unwrap().backups, s.backups);
        assert!(plan_migrate(&c, ShardId(0), s.backups[0])
            .unwrap_err()
            .contains("holds a replica"));
        assert!(plan_migrate(&c, ShardId(0), s.primary).is_err());
        assert!(plan_migrate(&c, ShardId(999), to).is_err());
        assert!(plan_migrate(&c, ShardId(0), NodeId(77)).is_err());
        let other = next
            .shards
            .iter()
            .find(|x| !x.is_replica(s.primary) && x.shard != ShardId(0))
            .map(|x| x.shard);
        if let Some(other) = other {
            assert!(plan_migrate(&next, other, s.primary)
                .unwrap_err()
                .contains("under way"));
        }
        let done = plan_migrated(&next, ShardId(0)).unwrap();
        assert!(done.migrations.is_empty());
        done.validate().unwrap();
    }

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
