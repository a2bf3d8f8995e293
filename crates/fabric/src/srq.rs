//! What every backend's shared receive queue does alike: which buffers may be
//! posted, and which posted buffer, and where in it, a message lands (seed 000 §3.2's multi-packet buffers: fixed
//! stride, consumed strictly in posting order). The backends differ only in the
//! lock around it and in how the bytes get there.

use std::collections::VecDeque;

use crate::verbs::{FabricError, MemoryRegion, RecvBuffer, SrqConfig};

/// The posted buffers of a shared receive queue.
pub(crate) struct SrqState {
    pub(crate) buffers: VecDeque<RecvBuffer>,
    /// Multi-packet: bytes of the front buffer already consumed.
    pub(crate) cursor: usize,
}

impl SrqState {
    pub(crate) fn new() -> Self {
        SrqState {
            buffers: VecDeque::new(),
            cursor: 0,
        }
    }
}

/// Where a message lands, decided under the SRQ lock (and written under it).
pub(crate) struct Landing {
    pub(crate) wr_id: u64,
    pub(crate) mr: MemoryRegion,
    /// Offset of the message within the receive buffer.
    pub(crate) offset_in_buffer: usize,
    /// Offset of the message within the region.
    pub(crate) offset_in_region: usize,
}

pub(crate) enum LandError {
    NoBuffer,
    /// The receiving queue pair left the ready state.
    Closed,
    /// The message is larger than a receive buffer; the completion names it.
    TooLarge {
        wr_id: u64,
    },
}

/// Post `buffers` (all or none): each must lie inside its region, be non-empty
/// and, for a multi-packet queue, a whole number of strides; the queue holds at
/// most `config.buffers_max`.
pub(crate) fn post(
    s: &mut SrqState,
    config: &SrqConfig,
    buffers: &[RecvBuffer],
) -> Result<(), FabricError> {
    for b in buffers {
        if b.offset
            .checked_add(b.len_bytes)
            .is_none_or(|end| end > b.mr.len_bytes())
            || b.len_bytes == 0
        {
            return Err(FabricError::Invalid(format!(
                "receive buffer [{}, +{}) outside its region of {} bytes",
                b.offset,
                b.len_bytes,
                b.mr.len_bytes()
            )));
        }
        if let Some(stride) = config.stride_bytes {
            if b.len_bytes % stride != 0 {
                return Err(FabricError::Invalid(format!(
                    "multi-packet buffer of {} bytes is not a multiple of the {stride} B stride",
                    b.len_bytes
                )));
            }
        }
    }
    let max = config.buffers_max;
    if s.buffers.len() + buffers.len() > max {
        return Err(FabricError::RecvQueueFull {
            posted: s.buffers.len(),
            buffers_max: max,
        });
    }
    s.buffers.extend(buffers.iter().cloned());
    Ok(())
}

/// Claim room for a message of `len` bytes. A single-message buffer is consumed
/// by a message too large for it, as on hardware; a multi-packet buffer is not.
pub(crate) fn claim(
    s: &mut SrqState,
    config: &SrqConfig,
    len: usize,
) -> Result<Landing, LandError> {
    match config.stride_bytes {
        None => {
            let b = s.buffers.pop_front().ok_or(LandError::NoBuffer)?;
            if len > b.len_bytes {
                return Err(LandError::TooLarge { wr_id: b.wr_id });
            }
            Ok(Landing {
                wr_id: b.wr_id,
                offset_in_region: b.offset,
                offset_in_buffer: 0,
                mr: b.mr,
            })
        }
        Some(stride) => {
            let front_len = s.buffers.front().ok_or(LandError::NoBuffer)?.len_bytes;
            if s.cursor > 0 && s.cursor + len > front_len {
                // Does not fit in the rest of this buffer: take the next one.
                // (A message too large for a whole, unused buffer is refused
                // below without consuming that buffer.)
                s.buffers.pop_front();
                s.cursor = 0;
            }
            let b = s.buffers.front().ok_or(LandError::NoBuffer)?;
            if len > b.len_bytes {
                return Err(LandError::TooLarge { wr_id: b.wr_id });
            }
            let at = s.cursor;
            let landing = Landing {
                wr_id: b.wr_id,
                mr: b.mr.clone(),
                offset_in_buffer: at,
                offset_in_region: b.offset + at,
            };
            let b_len = b.len_bytes;
            s.cursor = at + len.div_ceil(stride) * stride;
            if s.cursor >= b_len {
                s.buffers.pop_front();
                s.cursor = 0;
            }
            Ok(landing)
        }
    }
}
