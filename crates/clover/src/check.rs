//! A per-key linearizability checker for registers whose writes are unique.
//!
//! Each key is a register, checked on its own (linearizability is compositional).
//! The search is the Wing–Gong/Lowe one: repeatedly pick an operation that can go
//! first (no other remaining operation finished before it started), apply it to the
//! register if it agrees (a GET must read the current value), and backtrack; states
//! already explored (the set of operations linearized, the register's value) are
//! memoised. A PUT without a response (its client gave up) may take effect at any
//! point after it started, or never (one whose value nobody read is left out). Time is the simulator's tick: an operation
//! precedes another if it responded at an earlier tick than the other started.

use std::collections::{BTreeMap, HashSet};

/// Bound on the states explored for one key.
pub const STATES_MAX: usize = 4_000_000;

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Put(u64),
    Get(Option<u64>),
}

/// One operation of a history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub client: u32,
    pub key: u32,
    pub invoke: u64,
    /// `None`: no response (a PUT that may or may not have taken effect).
    pub response: Option<u64>,
    pub kind: Kind,
}

/// Why a history is not linearizable (or could not be decided).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Violation {
    #[error("key {key}: no linearization of its {ops} operations")]
    NotLinearizable { key: u32, ops: usize },
    #[error("key {key}: undecided within {STATES_MAX} states")]
    Undecided { key: u32 },
}

/// Check every key of `events`.
pub fn check_history(events: &[Event]) -> Result<(), Violation> {
    let mut per_key: BTreeMap<u32, Vec<Event>> = BTreeMap::new();
    for e in events {
        // A GET without a response says nothing.
        if matches!(e.kind, Kind::Get(_)) && e.response.is_none() {
            continue;
        }
        per_key.entry(e.key).or_default().push(*e);
    }
    for (key, mut ops) in per_key {
        // A PUT without a response whose value nobody read can always be placed
        // "never": leaving it out changes no verdict and keeps the search small.
        let read: HashSet<u64> = ops
            .iter()
            .filter_map(|e| match e.kind {
                Kind::Get(v) => v,
                Kind::Put(_) => None,
            })
            .collect();
        ops.retain(|e| match e.kind {
            Kind::Put(v) => e.response.is_some() || read.contains(&v),
            Kind::Get(_) => true,
        });
        check_key(key, ops)?;
    }
    Ok(())
}

struct Search {
    ops: Vec<(u64, u64, Kind)>,
    seen: HashSet<(Vec<u64>, Option<u64>)>,
    required: usize,
}

fn check_key(key: u32, mut ops: Vec<Event>) -> Result<(), Violation> {
    ops.sort_by_key(|e| (e.invoke, e.response));
    let n = ops.len();
    let mut search = Search {
        ops: ops
            .iter()
            .map(|e| (e.invoke, e.response.unwrap_or(u64::MAX), e.kind))
            .collect(),
        seen: HashSet::new(),
        required: ops.iter().filter(|e| e.response.is_some()).count(),
    };
    let mut done = vec![0u64; n.div_ceil(64)];
    match search.go(&mut done, 0, None) {
        Some(true) => Ok(()),
        Some(false) => Err(Violation::NotLinearizable { key, ops: n }),
        None => Err(Violation::Undecided { key }),
    }
}

impl Search {
    /// `Some(true)`: a linearization exists from here; `None`: out of budget.
    fn go(&mut self, done: &mut [u64], done_required: usize, value: Option<u64>) -> Option<bool> {
        if done_required == self.required {
            return Some(true);
        }
        if !self.seen.insert((done.to_vec(), value)) {
            return Some(false);
        }
        if self.seen.len() > STATES_MAX {
            return None;
        }
        let is_done = |d: &[u64], i: usize| d[i / 64] & (1 << (i % 64)) != 0;
        let min_response = (0..self.ops.len())
            .filter(|&i| !is_done(done, i))
            .map(|i| self.ops[i].1)
            .min()
            .expect("some operation remains");
        for i in 0..self.ops.len() {
            let (invoke, response, kind) = self.ops[i];
            if invoke > min_response {
                break; // sorted by invoke: no later one can go first either
            }
            if is_done(done, i) {
                continue;
            }
            let next = match kind {
                Kind::Get(v) if v != value => continue,
                Kind::Get(_) => value,
                Kind::Put(w) => Some(w),
            };
            done[i / 64] |= 1 << (i % 64);
            let req = done_required + usize::from(response != u64::MAX);
            let r = self.go(done, req, next);
            done[i / 64] &= !(1 << (i % 64));
            match r {
                Some(true) => return Some(true),
                None => return None,
                Some(false) => {}
            }
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(client: u32, invoke: u64, response: Option<u64>, kind: Kind) -> Event {
        Event {
            client,
            key: 0,
            invoke,
            response,
            kind,
        }
    }

    #[test]
    fn sequential_and_overlapping_histories_pass() {
        let h = [
            ev(0, 1, Some(2), Kind::Get(None)),
            ev(0, 3, Some(4), Kind::Put(1)),
            ev(1, 5, Some(8), Kind::Put(2)),
            ev(0, 6, Some(7), Kind::Get(Some(1))), // overlaps Put(2): may see 1
            ev(0, 9, Some(10), Kind::Get(Some(2))),
        ];
        assert_eq!(check_history(&h), Ok(()));
    }

    #[test]
    fn a_stale_read_and_a_lost_write_are_caught() {
        let stale = [
            ev(0, 1, Some(2), Kind::Put(1)),
            ev(0, 3, Some(4), Kind::Put(2)),
            ev(1, 5, Some(6), Kind::Get(Some(1))),
        ];
        assert!(matches!(
            check_history(&stale),
            Err(Violation::NotLinearizable { .. })
        ));
        let lost = [
            ev(0, 1, Some(2), Kind::Put(1)),
            ev(1, 5, Some(6), Kind::Get(None)),
        ];
        assert!(check_history(&lost).is_err());
        // A value read back and forth is not one write's.
        let flip = [
            ev(0, 1, Some(2), Kind::Put(1)),
            ev(1, 1, Some(20), Kind::Put(2)),
            ev(2, 3, Some(4), Kind::Get(Some(1))),
            ev(2, 5, Some(6), Kind::Get(Some(2))),
            ev(2, 7, Some(8), Kind::Get(Some(1))),
        ];
        assert!(check_history(&flip).is_err());
    }

    #[test]
    fn a_put_without_response_may_or_may_not_have_happened() {
        let took = [
            ev(0, 1, None, Kind::Put(7)),
            ev(1, 5, Some(6), Kind::Get(Some(7))),
            ev(1, 7, Some(8), Kind::Get(Some(7))),
        ];
        assert_eq!(check_history(&took), Ok(()));
        let never = [
            ev(0, 1, None, Kind::Put(7)),
            ev(1, 5, Some(6), Kind::Get(None)),
        ];
        assert_eq!(check_history(&never), Ok(()));
        // But not before it started.
        let early = [
            ev(1, 1, Some(2), Kind::Get(Some(7))),
            ev(0, 3, None, Kind::Put(7)),
        ];
        assert!(check_history(&early).is_err());
    }

    #[test]
    fn keys_are_checked_apart() {
        let mut a = ev(0, 1, Some(2), Kind::Put(1));
        a.key = 1;
        let mut b = ev(1, 3, Some(4), Kind::Get(None));
        b.key = 2;
        assert_eq!(check_history(&[a, b]), Ok(()));
    }
}
