//! Fault sites compiled into the protocol roles and fired only in simulation
//! (after FoundationDB's `BUGGIFY`).
//!
//! A site is a named place in a role where the code may take a legal but unusual
//! path: answer later, skip a step, fail an operation that can fail in production.
//! Outside the simulator a server has no [`Buggify`] and every site is a `false`
//! branch. In the simulator each server gets one, seeded from the run's seed and
//! the server's node id, so a run replays exactly: the first time a run reaches a
//! site, the site is switched on for the whole run with probability
//! [`SITE_ON_PROBABILITY`]; a switched-on site then fires each time it is reached
//! with probability [`FIRE_PROBABILITY`]. So most runs see a few sites fire often,
//! rather than every site fire rarely.
//!
//! A test can also force a site to fire its next `n` times
//! ([`Buggify::force`]), with the random sites off: the server's other roles
//! behave as in production.
//!
//! Sites (grep `buggify("`):
//! - `worker.defer-outcomes`: a worker leaves its replication ACKs and failures
//!   for a later step (slow ACK processing: the entry waits, unpublished, while
//!   its t-log rolls on and the cleaner runs);
//! - `control.skip-step`: the control role does nothing this step (a promotion,
//!   re-replication or b-log control step comes later);
//! - `control.install-fails`: installing a promotion's gathered union fails, as
//!   running out of space would;
//! - `digest.skip-step`, `clean.skip-step`, `redo.skip-step`: digest, cleaning
//!   and the redo role (`drpc`) run late.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use rowankv_types::NodeId;

/// Chance that a site reached for the first time in a run is switched on.
pub const SITE_ON_PROBABILITY: f64 = 0.25;
/// Chance that a switched-on site fires when reached.
pub const FIRE_PROBABILITY: f64 = 0.25;
/// Bound on distinct sites (a site name is a `&'static str` literal).
const SITES_MAX: usize = 64;

/// One server's fault sites.
#[derive(Debug)]
pub struct Buggify {
    /// Whether any site can fire: the fast path of a production server.
    armed: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Random sites (the simulator); off: only forced fires.
    random: bool,
    /// SplitMix64: small, seedable, and enough for coin flips.
    rng: u64,
    sites: HashMap<&'static str, bool>,
    /// Fires forced by a test, per site.
    forced: HashMap<&'static str, u32>,
}

impl State {
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        // 53 bits of the draw as a fraction of one.
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

impl Buggify {
    /// Fault sites of server `node` in the simulated run of `seed`.
    pub fn new(seed: u64, node: NodeId) -> Buggify {
        Buggify {
            armed: AtomicBool::new(true),
            state: Mutex::new(State {
                random: true,
                rng: seed ^ (u64::from(node.0) << 32) ^ 0x6275_6767_6966_7900,
                sites: HashMap::new(),
                forced: HashMap::new(),
            }),
        }
    }

    /// Every site off (a production server), until a test forces one.
    pub fn off() -> Buggify {
        Buggify {
            armed: AtomicBool::new(false),
            state: Mutex::new(State {
                random: false,
                rng: 0,
                sites: HashMap::new(),
                forced: HashMap::new(),
            }),
        }
    }

    /// Make `site` fire the next `times` times it is reached (tests).
    pub fn force(&self, site: &'static str, times: u32) {
        let mut s = self.state.lock();
        *s.forced.entry(site).or_insert(0) += times;
        self.armed.store(true, Ordering::Release);
    }

    /// Forced fires of `site` not used yet.
    pub fn forced_left(&self, site: &'static str) -> u32 {
        self.state.lock().forced.get(site).copied().unwrap_or(0)
    }

    /// Whether site `site` fires now.
    pub fn fire(&self, site: &'static str) -> bool {
        if !self.armed.load(Ordering::Acquire) {
            return false;
        }
        let mut s = self.state.lock();
        if let Some(left) = s.forced.get_mut(site).filter(|n| **n > 0) {
            *left -= 1;
            return true;
        }
        if !s.random {
            return false;
        }
        let on = match s.sites.get(site) {
            Some(&on) => on,
            None => {
                assert!(
                    s.sites.len() < SITES_MAX,
                    "more than {SITES_MAX} buggify sites"
                );
                let on = s.chance(SITE_ON_PROBABILITY);
                s.sites.insert(site, on);
                on
            }
        };
        on && s.chance(FIRE_PROBABILITY)
    }

    /// The sites reached so far and whether each is switched on.
    pub fn sites(&self) -> Vec<(&'static str, bool)> {
        let mut v: Vec<_> = self
            .state
            .lock()
            .sites
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_sites_fire_at_about_their_rate() {
        let fires = |seed| {
            let b = Buggify::new(seed, NodeId(3));
            (0..4000)
                .map(|i| b.fire(["a", "b", "c", "d"][i % 4]))
                .collect::<Vec<_>>()
        };
        assert_eq!(fires(7), fires(7), "same seed, same fires");
        // Over many seeds: about a quarter of sites on, each firing a quarter of
        // the time it is reached.
        let total: usize = (0..200u64)
            .map(|seed| fires(seed).iter().filter(|&&f| f).count())
            .sum();
        let rate = total as f64 / (200.0 * 4000.0);
        let expected = SITE_ON_PROBABILITY * FIRE_PROBABILITY;
        assert!(
            (rate - expected).abs() < expected * 0.3,
            "fire rate {rate}, expected about {expected}"
        );
    }
}
