//! What RowanKV nodes say to each other: RPC frames (`frame`) and the configuration
//! the CM publishes (`config`). Encodings only: the transport that carries them is
//! `rowankv-rpc`, above the fabric.
//!
//! Servers and clients depend on this crate, never on each other or on the CM's
//! implementation. Every decoder takes bytes from the network: it never panics and
//! never reads past its input.
#![forbid(unsafe_code)]

pub mod config;
pub mod frame;
