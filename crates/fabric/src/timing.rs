//! The timing model of the wire and the NIC for the loopback fabric
//! (`docs/wire-model.md`), as the media model is for persistent memory.
//!
//! The loopback fabric carries out a request on the poster's thread at once;
//! with a [`WireModel`] it instead gives each request two due times, computed
//! when it is posted, and makes it happen at them:
//! - **landing**: the sender's NIC takes its message slot and serialises the
//!   payload (message rate, link bandwidth), the message crosses the wire
//!   (one-way latency), the target's NIC takes a message slot and DMAs it;
//!   a request posted with `persist`, or a persisting FLUSH, adds the PCIe
//!   round trip that makes the bytes durable; a SEND posted with `persist`,
//!   or a FLUSH that follows a SEND on its queue pair, first adds the
//!   sender-side lookup of where that message lands (the SFlush of seed 002,
//!   which must ask the target NIC);
//! - **completion**: the acknowledgement (or the READ's data) crosses back.
//!
//! The requests of one queue pair land and complete in posting order. A NIC's
//! message slots are shared by all its queue pairs (the contention that makes
//! message rate matter); the acknowledgement path is not modelled as
//! contended (its messages are small and, on RC hardware, coalesced).
//!
//! Nothing busy-waits for a due time: work that is due is carried out by
//! whichever thread polls a completion queue the queue pair completes into or
//! posts to it (threads that spin on completions anyway), and by one engine
//! thread per fabric that sleeps until the next due time, so a landing happens
//! even when nobody polls (a receiver waiting on its receive queue, a
//! one-sided write nobody waits for). The engine's sleep is as coarse as the
//! kernel's timers (tens of µs here): where a poller is spinning, due times
//! are met to within a poll; where none is, to within a wake-up.
//!
//! Off unless a fabric is built with one ([`crate::LoopbackFabric::with_model`]);
//! every result measured with it must say so ([`WireModel::label`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Costs of the wire and of the NICs. Defaults ([`WireModel::CONNECTX5`]) are
/// calibrated once, from published ConnectX-5 figures and seed 002's own
/// numbers (`docs/wire-model.md`), and held fixed for every experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireModel {
    /// One-way latency of a message from the sender's NIC to the target's:
    /// the NICs' pipelines, the wire and a switch.
    pub one_way_ns: u64,
    /// Messages one NIC can put on the wire per second, and (separately)
    /// take off it.
    pub nic_msgs_per_sec: u64,
    /// Bytes per second of a NIC's link, each direction.
    pub link_bytes_per_sec: u64,
    /// The target NIC's PCIe round trip that makes landed bytes durable (a
    /// request posted with `persist`, a FLUSH with persistence placement).
    pub dma_persist_ns: u64,
    /// The sender NIC's lookup of where an earlier SEND landed, before a FLUSH
    /// of it can be issued (SFlush).
    pub lookup_ns: u64,
}

impl WireModel {
    /// ConnectX-5 on a 100 Gb/s link through one switch (`docs/wire-model.md`).
    pub const CONNECTX5: WireModel = WireModel {
        one_way_ns: 1_000,
        nic_msgs_per_sec: 75_000_000,
        link_bytes_per_sec: 12_500_000_000,
        dma_persist_ns: 1_000,
        lookup_ns: 7_000,
    };

    /// The line every result measured with this model carries.
    pub fn label(&self) -> String {
        format!(
            "wire model on: one-way {:.1} µs, {} Mmsg/s per NIC, {:.1} GB/s, persist DMA {:.1} µs, SFlush lookup {:.1} µs",
            self.one_way_ns as f64 / 1e3,
            self.nic_msgs_per_sec / 1_000_000,
            self.link_bytes_per_sec as f64 / 1e9,
            self.dma_persist_ns as f64 / 1e3,
            self.lookup_ns as f64 / 1e3
        )
    }

    /// Whether the values are usable (rates above zero).
    pub fn check(&self) -> Result<(), String> {
        if self.nic_msgs_per_sec == 0 || self.link_bytes_per_sec == 0 {
            return Err(format!("a wire model needs positive rates: {self:?}"));
        }
        Ok(())
    }

    /// A NIC's time for one message.
    pub fn msg_ns(&self) -> u64 {
        1_000_000_000u64.div_ceil(self.nic_msgs_per_sec)
    }

    /// The link's time for `bytes`.
    pub fn bytes_ns(&self, bytes: usize) -> u64 {
        ((bytes as u128 * 1_000_000_000).div_ceil(self.link_bytes_per_sec as u128)) as u64
    }

    /// When a request posted at `now` lands and completes. Reserves the
    /// sender NIC's transmit slot (`tx`) and the target NIC's receive slot
    /// (`rx`); `extra_one_way_ns` is a link delay set by fault injection.
    pub(crate) fn schedule(
        &self,
        now: u64,
        shape: Shape,
        tx: &AtomicU64,
        rx: &AtomicU64,
        extra_one_way_ns: u64,
    ) -> Due {
        let earliest = now + if shape.lookup { self.lookup_ns } else { 0 };
        let send_busy = self.msg_ns() + self.bytes_ns(shape.out_bytes);
        let sent = reserve(tx, earliest, send_busy) + send_busy;
        let arrives = sent + self.one_way_ns + extra_one_way_ns;
        let mut land = reserve(rx, arrives, self.msg_ns()) + self.msg_ns();
        if shape.persist {
            land += self.dma_persist_ns;
        }
        let complete = land + self.one_way_ns + extra_one_way_ns + self.bytes_ns(shape.back_bytes);
        Due { land, complete }
    }
}

/// What the model needs to know of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Bytes carried to the target (WRITE and SEND payloads, atomics' operands).
    pub out_bytes: usize,
    /// Bytes carried back (READ data, atomics' old values).
    pub back_bytes: usize,
    /// The target makes the bytes durable before it acknowledges.
    pub persist: bool,
    /// The sender first looks up where an earlier SEND landed.
    pub lookup: bool,
}

/// A request's due times on the fabric's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Due {
    pub land: u64,
    pub complete: u64,
}

/// Take `busy` ns of a NIC's slot at `earliest` or when it is next free;
/// returns the start.
fn reserve(slot: &AtomicU64, earliest: u64, busy: u64) -> u64 {
    let mut start = earliest;
    let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
        start = free.max(earliest);
        Some(start + busy)
    });
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> WireModel {
        WireModel {
            one_way_ns: 1_000,
            nic_msgs_per_sec: 10_000_000,      // 100 ns a message
            link_bytes_per_sec: 1_000_000_000, // 1 ns a byte
            dma_persist_ns: 500,
            lookup_ns: 7_000,
        }
    }

    #[test]
    fn a_request_lands_after_serialisation_and_one_way_and_completes_a_way_later() {
        let m = model();
        let (tx, rx) = (AtomicU64::new(0), AtomicU64::new(0));
        let shape = Shape {
            out_bytes: 1_000,
            ..Shape::default()
        };
        let d = m.schedule(10_000, shape, &tx, &rx, 0);
        // 100 ns message + 1000 ns bytes, 1000 ns wire, 100 ns at the target.
        assert_eq!(d.land, 10_000 + 1_100 + 1_000 + 100);
        assert_eq!(d.complete, d.land + 1_000);
        // A READ's data comes back at the link's rate; persistence and the
        // lookup add their costs.
        let (tx, rx) = (AtomicU64::new(0), AtomicU64::new(0));
        let read = Shape {
            back_bytes: 4_000,
            ..Shape::default()
        };
        let r = m.schedule(0, read, &tx, &rx, 0);
        assert_eq!(r.complete - r.land, 1_000 + 4_000);
        let (tx, rx) = (AtomicU64::new(0), AtomicU64::new(0));
        let flush = Shape {
            persist: true,
            lookup: true,
            ..Shape::default()
        };
        let f = m.schedule(0, flush, &tx, &rx, 0);
        assert_eq!(f.land, 7_000 + 100 + 1_000 + 100 + 500);
    }

    #[test]
    fn a_nics_message_slots_are_shared_so_its_rate_bounds_every_queue_pair() {
        let m = model();
        let (tx, rx) = (AtomicU64::new(0), AtomicU64::new(0));
        let last = (0..1_000)
            .map(|_| m.schedule(0, Shape::default(), &tx, &rx, 0))
            .last()
            .unwrap();
        // 1000 messages at 10 M/s take 100 µs to leave the sender.
        assert_eq!(last.land, 1_000 * 100 + 1_000 + 100);
        // Two senders into one target: the target's receive slots queue them.
        let (tx1, tx2, rx) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let a = m.schedule(0, Shape::default(), &tx1, &rx, 0);
        let b = m.schedule(0, Shape::default(), &tx2, &rx, 0);
        assert_eq!(b.land, a.land + 100);
    }

    #[test]
    fn the_label_names_every_value_and_a_zero_rate_is_refused() {
        let l = WireModel::CONNECTX5.label();
        assert!(l.starts_with("wire model on"), "{l}");
        for part in ["1.0 µs", "75 Mmsg/s", "12.5 GB/s", "7.0 µs"] {
            assert!(l.contains(part), "{l} lacks {part}");
        }
        assert!(WireModel::CONNECTX5.check().is_ok());
        let bad = WireModel {
            nic_msgs_per_sec: 0,
            ..WireModel::CONNECTX5
        };
        assert!(bad.check().is_err());
    }
}
