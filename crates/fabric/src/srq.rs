//! What every backend's shared receive queue does alike: which posted buffer, and
//! where in it, a message lands (seed 000 §3.2's multi-packet buffers: fixed
//! stride, consumed strictly in posting order). The backends differ only in the
//! lock around it and in how the bytes get there.

use std::collections::VecDeque;

use crate::verbs::{MemoryRegion, RecvBuffer, SrqConfig};

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
