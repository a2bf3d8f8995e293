//! The receiver of every design: one state machine serving every connection.
//!
//! [`Server::poll`] does one pass: it retires its send completions, takes up what
//! arrived (from the receive queue for DaRPC, FaSST and Octopus; by reading each
//! connection's next ring slot for FaRM, L5, RFP and ScaleRPC), and for each
//! request, in this order: makes the request durable (the CPU persists the bytes in
//! the receiver's memory — the step that gives every classic design its durability
//! in seed 002 §3), runs the handler, spends the processing delay, and answers in
//! the design's pattern. [`Server::spawn`] runs passes on a thread of its own; a
//! test may step passes itself (on a manual clock, for instance).
//!
//! Invariants: a connection's requests are taken up strictly in sequence order, one
//! at a time; nothing is answered before its persist (when `persist_requests`); a
//! receive buffer is posted again before its request is answered, so a client that
//! sends its next request on seeing the reply always finds a buffer.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rowankv_fabric::{
    Access, Completion, CompletionQueue, CqKind, DramMemory, LocalAddr, MemoryRegion, Nic, Op,
    QueuePair, RecvBuffer, RegionMemory, RemoteRegion, SharedReceiveQueue, SrqConfig, WcOpcode,
    WcStatus, WorkRequest,
};
use rowankv_types::{Clock, QpNum, SystemClock};

use crate::client::{Client, ClientParts};
use crate::layout::{Header, Kind, Layout, HEADER_BYTES};
use crate::{
    Design, Handler, RpcError, ServerConfig, ServerStats, IDLE_SPINS_BEFORE_YIELD, UD_MTU_BYTES,
};

/// Completions taken per poll of a completion queue.
const POLL_BATCH: usize = 16;

/// Work requests a queue pair may have outstanding, from the window: each request
/// takes at most two per side (L5's two WRITEs; ScaleRPC's READ and reply), and a
/// window's worth may still await completions while the next window is answered.
pub(crate) fn send_depth(inflight_max: usize) -> usize {
    4 * inflight_max + 4
}

/// A server's-side connection.
struct Conn<N: Nic> {
    qp: N::Qp,
    client: RemoteRegion,
    /// The sequence number of the next request to take up.
    next_seq: u64,
    /// ScaleRPC warm-up: the READ of the request's data in flight.
    fetch: Option<Fetch>,
}

#[derive(Clone, Copy, Debug)]
struct Fetch {
    wr_id: u64,
    header: Header,
    done: bool,
}

/// The receiver. See the module documentation.
pub struct Server<N: Nic> {
    design: Design,
    config: ServerConfig,
    layout: Layout,
    handler: Handler,
    clock: Arc<dyn Clock>,
    nic: N,
    region: MemoryRegion,
    send_cq: N::Cq,
    recv_cq: N::Cq,
    srq: N::Srq,
    conns: Vec<Conn<N>>,
    by_qpn: HashMap<QpNum, usize>,
    stats: Arc<Mutex<ServerStats>>,
    /// ScaleRPC: the group being served and the requests served in its slice.
    active_group: usize,
    served_in_slice: usize,
    next_wr_id: u64,
    message: Vec<u8>,
}

impl<N: Nic> Server<N> {
    /// A server of `design` on `nic`, whose rings and stores live in `memory` (at
    /// least [`Layout::server_bytes`]; a `Pool` for durability). Registers the
    /// memory and, for the designs that receive, posts every receive buffer.
    pub fn new(
        design: Design,
        nic: N,
        memory: Arc<dyn RegionMemory>,
        config: ServerConfig,
        handler: Handler,
    ) -> Result<Server<N>, RpcError> {
        config.validate()?;
        let layout = Layout::new(&config);
        let need = layout.server_bytes();
        if memory.len_bytes() < need {
            return Err(RpcError::MemoryTooSmall {
                need,
                got: memory.len_bytes(),
            });
        }
        let region = nic.register(memory, 0, need, Access::ALL)?;
        let buffers = layout.server_buffers();
        let send_cq = nic.create_cq(CqKind::Bounded {
            capacity: config.clients_max * send_depth(config.inflight_max),
        })?;
        let recv_cq = nic.create_cq(CqKind::Bounded { capacity: buffers })?;
        let srq = nic.create_srq(SrqConfig::single(buffers))?;
        let server = Server {
            design,
            config,
            layout,
            handler,
            clock: SystemClock::new(),
            nic,
            region,
            send_cq,
            recv_cq,
            srq,
            conns: Vec::with_capacity(config.clients_max),
            by_qpn: HashMap::with_capacity(config.clients_max),
            stats: Arc::new(Mutex::new(ServerStats::default())),
            active_group: 0,
            served_in_slice: 0,
            next_wr_id: 0,
            message: Vec::new(),
        };
        if server.takes_receives() {
            let all: Vec<RecvBuffer> = (0..buffers).map(|i| server.buffer(i)).collect();
            server.srq.post_recv(&all)?;
        }
        Ok(server)
    }

    /// Measure the processing delay (and the clients' reply timeouts) on `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Server<N> {
        self.clock = clock;
        self
    }

    pub fn design(&self) -> Design {
        self.design
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The registered region holding rings, stores and results (for tests that
    /// inspect what the receiver's memory holds).
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }

    pub fn stats(&self) -> ServerStats {
        *self.stats.lock()
    }

    fn takes_receives(&self) -> bool {
        matches!(self.design, Design::DaRpc | Design::Fasst | Design::Octopus)
    }

    /// The `index`-th receive buffer: a ring slot. FaSST's are one MTU at most, as
    /// an unreliable-datagram receive buffer is: a longer message cannot land.
    fn buffer(&self, index: usize) -> RecvBuffer {
        let len = match self.design {
            Design::Fasst => self.layout.request_slot_bytes().min(UD_MTU_BYTES),
            _ => self.layout.request_slot_bytes(),
        };
        RecvBuffer {
            wr_id: index as u64,
            mr: self.region.clone(),
            offset: self.layout.ring_buffer(index),
            len_bytes: len,
        }
    }

    /// Connect a client on `client_nic`: a queue pair at each end, the client's
    /// memory (DRAM: nothing there needs to survive) registered, and the regions
    /// exchanged. Before `spawn`; at most `clients_max` times.
    pub fn connect(&mut self, client_nic: &N) -> Result<Client<N>, RpcError> {
        if self.conns.len() >= self.config.clients_max {
            return Err(RpcError::ServerFull {
                clients_max: self.config.clients_max,
            });
        }
        let depth = send_depth(self.config.inflight_max);
        let w = self.config.inflight_max;
        let send_cq = client_nic.create_cq(CqKind::Bounded { capacity: depth })?;
        let recv_cq = client_nic.create_cq(CqKind::Bounded { capacity: w })?;
        let srq = client_nic.create_srq(SrqConfig::single(w))?;
        let memory: Arc<dyn RegionMemory> = Arc::new(DramMemory::new(self.layout.client_bytes()));
        let client_region =
            client_nic.register(memory, 0, self.layout.client_bytes(), Access::ALL)?;
        let client_qp = client_nic.create_qp(&send_cq, &recv_cq, Some(&srq), depth)?;
        let server_qp = self
            .nic
            .create_qp(&self.send_cq, &self.recv_cq, Some(&self.srq), depth)?;
        server_qp.connect(client_qp.addr())?;
        client_qp.connect(server_qp.addr())?;
        let index = self.conns.len();
        self.by_qpn.insert(server_qp.addr().qpn, index);
        self.conns.push(Conn {
            qp: server_qp,
            client: client_region.remote(),
            next_seq: 1,
            fetch: None,
        });
        Client::new(ClientParts {
            design: self.design,
            config: self.config,
            index: index as u32,
            nic: client_nic.clone(),
            qp: client_qp,
            send_cq,
            recv_cq,
            srq,
            region: client_region,
            server: self.region.remote(),
            clock: self.clock.clone(),
        })
    }

    /// One pass; returns the requests answered in it.
    pub fn poll(&mut self) -> Result<usize, RpcError> {
        self.drain_send_cq()?;
        match self.design {
            Design::DaRpc | Design::Fasst | Design::Octopus => self.serve_receives(),
            Design::Farm | Design::L5 | Design::Rfp => self.serve_rings(0..self.conns.len()),
            Design::ScaleRpc => self.serve_groups(),
        }
    }

    /// Run passes on a thread of its own until [`RunningServer::stop`].
    pub fn spawn(self) -> Result<RunningServer<N>, RpcError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = self.stats.clone();
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("classic-rpc-{}", self.design.name()))
            .spawn(move || {
                let mut server = self;
                let mut idle = 0u32;
                while !stopping.load(Ordering::Acquire) {
                    if server.poll()? > 0 {
                        idle = 0;
                        continue;
                    }
                    idle = idle.wrapping_add(1);
                    if idle.is_multiple_of(IDLE_SPINS_BEFORE_YIELD) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                Ok(server)
            })
            .map_err(|e| RpcError::Config(format!("starting the server thread: {e}")))?;
        Ok(RunningServer {
            stop,
            stats,
            thread: Some(thread),
        })
    }

    fn drain_send_cq(&mut self) -> Result<(), RpcError> {
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        loop {
            let n = self.send_cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                crate::succeeded(wc)?;
                if wc.opcode == WcOpcode::Read {
                    let fetch = self
                        .conns
                        .iter_mut()
                        .filter_map(|c| c.fetch.as_mut())
                        .find(|f| f.wr_id == wc.wr_id);
                    if let Some(f) = fetch {
                        f.done = true;
                    }
                }
            }
            if n < wcs.len() {
                return Ok(());
            }
        }
    }

    fn malformed(&self) {
        self.stats.lock().malformed += 1;
    }

    /// DaRPC, FaSST, Octopus: take up what the receive queue holds.
    fn serve_receives(&mut self) -> Result<usize, RpcError> {
        let mut wcs = [Completion::BLANK; POLL_BATCH];
        let n = self.recv_cq.poll(&mut wcs)?;
        let mut served = 0;
        for wc in &wcs[..n] {
            let Some(buffer) = usize::try_from(wc.wr_id)
                .ok()
                .filter(|&b| b < self.layout.server_buffers())
            else {
                return Err(RpcError::Protocol(format!("unknown buffer {}", wc.wr_id)));
            };
            let conn = self.by_qpn.get(&wc.qpn).copied();
            let taken = match (conn, wc.status) {
                (Some(c), WcStatus::Success) => self.take_received(c, buffer, wc)?,
                _ => None,
            };
            // The buffer goes back before the request is answered.
            self.srq.post_recv(&[self.buffer(buffer)])?;
            self.stats.lock().recvs_posted += 1;
            match taken {
                Some((c, header, payload)) => {
                    self.serve(c, header, &payload)?;
                    served += 1;
                }
                None => self.malformed(),
            }
        }
        Ok(served)
    }

    /// A received request, checked and made durable: `None` if it is malformed.
    fn take_received(
        &mut self,
        c: usize,
        buffer: usize,
        wc: &Completion,
    ) -> Result<Option<(usize, Header, Vec<u8>)>, RpcError> {
        let seq = self.conns[c].next_seq;
        let at = match (self.design, wc.opcode) {
            (Design::DaRpc | Design::Fasst, WcOpcode::Recv) => self.layout.ring_buffer(buffer),
            // The immediate names the request; its bytes are where the WRITE put
            // them, the connection's ring slot (the buffer only notified).
            (Design::Octopus, WcOpcode::RecvWriteImm) if wc.imm == Some(seq as u32) => {
                self.layout.ring_slot(c, self.layout.slot_of(seq))
            }
            _ => return Ok(None),
        };
        let Some((header, payload)) = self.read_request(c, at, seq) else {
            return Ok(None);
        };
        let whole = HEADER_BYTES + payload.len();
        // A SEND's bytes landed, or the bytes a WRITE with immediate wrote: all of
        // the message and nothing else.
        if wc.byte_len as usize != whole || header.kind != Kind::Inline {
            return Ok(None);
        }
        let durable_at = match self.design {
            Design::Octopus => at,
            _ => {
                // DaRPC: "the data is copied to the target memory space according
                // to the metadata" (seed 002 §3): the store slot of the request.
                let store = self.layout.store_slot(c, self.layout.slot_of(seq));
                self.region.write(store, &header.encode());
                if !payload.is_empty() {
                    self.region.write(store + HEADER_BYTES, &payload);
                }
                self.stats.lock().bytes_copied += whole as u64;
                store
            }
        };
        self.persist(durable_at, whole);
        Ok(Some((c, header, payload)))
    }

    /// The request `seq` of connection `c` at `at`, if it is wholly there.
    fn read_request(&self, c: usize, at: usize, seq: u64) -> Option<(Header, Vec<u8>)> {
        let mut b = [0u8; HEADER_BYTES];
        self.region.read(at, &mut b);
        let header = Header::decode(&b).filter(|h| h.seq == seq && h.client as usize == c)?;
        if header.len as usize > self.design.request_bytes_limit(&self.config) {
            return None;
        }
        if header.kind == Kind::Descriptor {
            return Some((header, Vec::new()));
        }
        let mut payload = vec![0u8; header.len as usize];
        self.region.read(at + HEADER_BYTES, &mut payload);
        header.matches(&payload).then_some((header, payload))
    }

    /// FaRM, L5, RFP, ScaleRPC: read each connection's next ring slot.
    fn serve_rings(&mut self, clients: Range<usize>) -> Result<usize, RpcError> {
        let mut served = 0;
        for c in clients {
            let seq = self.conns[c].next_seq;
            let slot = self.layout.slot_of(seq);
            if let Some(fetch) = self.conns[c].fetch {
                if fetch.done {
                    self.conns[c].fetch = None;
                    served += self.finish_warmup(c, fetch.header)?;
                }
                continue;
            }
            let at = self.layout.ring_slot(c, slot);
            // Not there, or still landing: FaRM's and L5's receivers poll again.
            let Some((header, payload)) = self.read_request(c, at, seq) else {
                continue;
            };
            match header.kind {
                Kind::Inline => {
                    self.persist(at, HEADER_BYTES + payload.len());
                    self.serve(c, header, &payload)?;
                    served += 1;
                }
                Kind::Descriptor if self.design == Design::ScaleRpc => {
                    self.start_warmup(c, slot, header)?;
                }
                // A header this design never sends: the client is broken. The slot
                // is left as it is; the client's call times out.
                _ => {}
            }
        }
        Ok(served)
    }

    /// ScaleRPC warm-up: READ the request's data from the client's staging slot
    /// into the store slot.
    fn start_warmup(&mut self, c: usize, slot: usize, header: Header) -> Result<(), RpcError> {
        // The descriptor must point at the client's own staging slot for this
        // request; anything else is a descriptor still landing.
        if header.aux != self.layout.staging_slot(slot) as u64 {
            return Ok(());
        }
        let store = self.layout.store_slot(c, slot);
        self.next_wr_id += 1;
        let wr_id = self.next_wr_id;
        let conn = &self.conns[c];
        let op = Op::Read {
            remote: conn.client.at(header.aux),
            len: header.len as usize,
            local: LocalAddr {
                mr: &self.region,
                offset: store + HEADER_BYTES,
            },
        };
        conn.qp.post_send(&[WorkRequest::new(wr_id, op)])?;
        {
            let mut stats = self.stats.lock();
            stats.verbs.read += 1;
            stats.bytes_to_server += header.len as u64;
        }
        self.conns[c].fetch = Some(Fetch {
            wr_id,
            header,
            done: false,
        });
        Ok(())
    }

    /// ScaleRPC warm-up, the data fetched: check it, persist it (the clflush of
    /// seed 002 §4.4.2), serve it.
    fn finish_warmup(&mut self, c: usize, header: Header) -> Result<usize, RpcError> {
        let store = self.layout.store_slot(c, self.layout.slot_of(header.seq));
        let mut payload = vec![0u8; header.len as usize];
        self.region.read(store + HEADER_BYTES, &mut payload);
        if !header.matches(&payload) {
            // The descriptor was read torn: read it again on the next pass.
            return Ok(0);
        }
        self.region.write(store, &header.encode());
        self.persist(store, HEADER_BYTES + payload.len());
        self.stats.lock().warmups += 1;
        self.serve(c, header, &payload)?;
        Ok(1)
    }

    /// ScaleRPC: serve the active group's connections; a group that had nothing
    /// ready, or used up its slice, hands over to the next.
    fn serve_groups(&mut self) -> Result<usize, RpcError> {
        let n = self.conns.len();
        if n == 0 {
            return Ok(0);
        }
        let size = self.config.scalerpc_group_size;
        let groups = n.div_ceil(size);
        let g = self.active_group % groups;
        let served = self.serve_rings(g * size..((g + 1) * size).min(n))?;
        self.served_in_slice += served;
        if groups > 1
            && (served == 0 || self.served_in_slice >= self.config.scalerpc_slice_requests_max)
        {
            self.active_group = (g + 1) % groups;
            self.served_in_slice = 0;
            self.stats.lock().group_switches += 1;
        }
        Ok(served)
    }

    /// Make `[at, at + len)` durable: the receiver CPU's persist.
    fn persist(&self, at: usize, len: usize) {
        if !self.config.persist_requests {
            return;
        }
        self.region.persist(at, len);
        let mut stats = self.stats.lock();
        stats.persists += 1;
        stats.bytes_persisted += len as u64;
    }

    /// Handle a durable request and answer it.
    fn serve(&mut self, c: usize, header: Header, payload: &[u8]) -> Result<(), RpcError> {
        assert_eq!(
            header.seq, self.conns[c].next_seq,
            "requests are served in order"
        );
        let reply = (self.handler)(payload);
        let delay_ns = self.config.processing_delay_ns;
        if delay_ns > 0 {
            // Busy, as a CPU processing a request is; measured on the clock.
            let start = self.clock.now_ns();
            while self.clock.now_ns().saturating_sub(start) < delay_ns {
                std::hint::spin_loop();
            }
            self.stats.lock().processing_ns += self.clock.now_ns().saturating_sub(start);
        }
        self.stats.lock().requests += 1;
        self.respond(c, header.seq, &reply)?;
        self.conns[c].next_seq += 1;
        Ok(())
    }

    fn respond(&mut self, c: usize, seq: u64, reply: &[u8]) -> Result<(), RpcError> {
        let limit = self.design.reply_bytes_limit(&self.config);
        let (header, body) = if reply.len() > limit {
            self.stats.lock().replies_too_large += 1;
            let refused = reply.len() as u64;
            (
                Header::new(seq, Kind::ReplyTooLarge, c as u32, refused, &[]),
                &[][..],
            )
        } else {
            (Header::new(seq, Kind::Inline, c as u32, 0, reply), reply)
        };
        let slot = self.layout.slot_of(seq);
        if self.design == Design::Rfp {
            // RFP: the result stays here for the client to fetch; body first, so a
            // header seen means a body written (the checksum covers the rest).
            let at = self.layout.result_slot(c, slot);
            if !body.is_empty() {
                self.region.write(at + HEADER_BYTES, body);
            }
            self.region.write(at, &header.encode());
            return Ok(());
        }
        self.message.clear();
        self.message.extend_from_slice(&header.encode());
        self.message.extend_from_slice(body);
        self.next_wr_id += 1;
        let conn = &self.conns[c];
        let remote = conn.client.at(self.layout.reply_slot(slot) as u64);
        let op = match self.design {
            Design::DaRpc | Design::Fasst => Op::Send {
                data: &self.message,
                imm: None,
            },
            Design::Octopus => Op::Write {
                data: &self.message,
                remote,
                imm: Some(seq as u32),
            },
            _ => Op::Write {
                data: &self.message,
                remote,
                imm: None,
            },
        };
        conn.qp
            .post_send(&[WorkRequest::new(self.next_wr_id, op)])?;
        let mut stats = self.stats.lock();
        match self.design {
            Design::DaRpc | Design::Fasst => stats.verbs.send += 1,
            Design::Octopus => stats.verbs.write_imm += 1,
            _ => stats.verbs.write += 1,
        }
        stats.bytes_to_client += self.message.len() as u64;
        Ok(())
    }
}

/// A server running on its own thread.
pub struct RunningServer<N: Nic> {
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<ServerStats>>,
    thread: Option<std::thread::JoinHandle<Result<Server<N>, RpcError>>>,
}

impl<N: Nic> RunningServer<N> {
    pub fn stats(&self) -> ServerStats {
        *self.stats.lock()
    }

    /// Stop after the current pass; the server back, or the error that ended its
    /// thread.
    pub fn stop(mut self) -> Result<Server<N>, RpcError> {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take().expect("stopped once");
        thread.join().map_err(|_| RpcError::ServerPanicked)?
    }
}

impl<N: Nic> Drop for RunningServer<N> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
