//! RowanKV's RPC transport, the layer between the fabric and the protocol roles:
//! the endpoint that carries [`rowankv_wire::frame`] frames in fabric SEND/RECV
//! messages (`endpoint`), and connection set-up between endpoints (`directory`: in
//! one process, and across processes through `netcm`, the network connection
//! manager).
//!
//! `wire` (encodings, no transport) sits below it; servers, clients and the CM sit
//! above it.
#![forbid(unsafe_code)]

pub mod directory;
pub mod endpoint;
pub mod netcm;
