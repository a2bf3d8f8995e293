//! Operator commands a server process answers itself, over its connection
//! manager (so only a peer that proves the cluster's secret reaches them).
//!
//! `rowankv clock-step NODE --ms N` steps server `NODE`'s calendar clock by `N`
//! ms, as an operator's `date -s` or an NTP step would set its host's clock:
//! the server's [`rowankv_types::SteppedClock`] offsets
//! [`rowankv_types::Clock::unix_ms`] (which only expiry times read) and never
//! its monotonic clock (leases, timeouts). A chaos run steps servers' clocks
//! this way (the `clock-jump` fault, `docs/chaos.md`); nothing but expiry may
//! notice.
//!
//! The exchange is one connection-manager request to the server's
//! [`CLOCK_SERVICE`], private data JSON: `{"step_ms": i64}`, answered
//! `{"offset_ms": i64}` (the offset after the step), or refused with the reason
//! (a malformed request, a step beyond [`rowankv_types::CLOCK_STEP_MS_MAX`]).

use std::time::Duration;

use rowankv_fabric::{Nic, QpAddr};
use rowankv_rpc::directory::{Accepted, Acceptor};
use rowankv_types::{NodeId, QpNum, SteppedClock};
use serde::{Deserialize, Serialize};

use crate::client::attach_for_member;
use crate::ProcessError;

/// The server's service that steps its calendar clock.
pub const CLOCK_SERVICE: u16 = u16::MAX - 5;

/// What `rowankv clock-step` asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockStep {
    pub step_ms: i64,
}

/// What the server answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockOffset {
    pub offset_ms: i64,
}

/// Answer every pending clock step of server `me` (its `clock`).
pub fn serve_clock(acceptor: &Acceptor, clock: &SteppedClock, me: NodeId) {
    acceptor.serve_pending(|from, private| {
        let request: ClockStep = serde_json::from_slice(private)
            .map_err(|e| format!("refused: clock-step: a malformed request: {e}"))?;
        let offset_ms = clock
            .step(request.step_ms)
            .map_err(|e| format!("refused: clock-step: {e}"))?;
        tracing::warn!(
            step_ms = request.step_ms, offset_ms, by = %from.node,
            "the calendar clock was stepped (rowankv clock-step)"
        );
        Ok(Accepted {
            qp: QpAddr {
                node: me,
                qpn: QpNum(0),
            },
            private: serde_json::to_vec(&ClockOffset { offset_ms }).expect("serializes"),
        })
    });
}

/// Step server `node`'s calendar clock by `step_ms`, reaching it through the
/// configuration the CMs (`cms`) serve; the server's offset after the step.
pub fn clock_step(
    cluster_id: u64,
    secret: &[u8],
    cms: &[String],
    node: NodeId,
    step_ms: i64,
    timeout: Duration,
) -> Result<i64, ProcessError> {
    let (net, _, _) = attach_for_member(cluster_id, secret, cms, node, timeout)?;
    let from = QpAddr {
        node: net.nic.node(),
        qpn: QpNum(0),
    };
    let private = serde_json::to_vec(&ClockStep { step_ms }).expect("serializes");
    let answer = net
        .directory
        .request(node, CLOCK_SERVICE, from, private)
        .map_err(|e| ProcessError(format!("reaching {node}: {e}")))?
        .recv_timeout(timeout)
        .map_err(|_| ProcessError(format!("{node} did not answer within {timeout:?}")))?
        .map_err(|why| ProcessError(format!("{node}: {why}")))?;
    let offset: ClockOffset = serde_json::from_slice(&answer.private)
        .map_err(|e| ProcessError(format!("a malformed answer from {node}: {e}")))?;
    Ok(offset.offset_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_messages_fit_the_private_data_and_refuse_unknown_fields() {
        for step_ms in [i64::MIN, -1, 0, i64::MAX] {
            let bytes = serde_json::to_vec(&ClockStep { step_ms }).unwrap();
            assert!(bytes.len() <= rowankv_rpc::directory::PRIVATE_BYTES_MAX);
            assert_eq!(
                serde_json::from_slice::<ClockStep>(&bytes).unwrap().step_ms,
                step_ms
            );
        }
        assert!(serde_json::from_str::<ClockStep>(r#"{"step_ms":1,"x":2}"#).is_err());
        assert!(serde_json::from_str::<ClockStep>(r#"{"step_ms":"1"}"#).is_err());
        assert!(serde_json::from_str::<ClockStep>(r#"{"step_ms":1e400}"#).is_err());
    }
}
