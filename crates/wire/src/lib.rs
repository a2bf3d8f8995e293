//! What RowanKV nodes say to each other: RPC frames (`frame`), the configuration
//! the CM publishes (`config`), the RPC endpoint over the fabric (`endpoint`), and
//! in-process connection set-up between endpoints (`directory`).
//!
//! Servers and clients depend on this crate, never on each other or on the CM's
//! implementation. Every decoder takes bytes from the network: it never panics and
//! never reads past its input.
#![forbid(unsafe_code)]

pub mod config;
pub mod directory;
pub mod endpoint;
pub mod frame;
