//! The command layer's tests, through its public API only: every command against
//! `MemKeyspace`, reply shapes in both protocols, authentication, cluster mode,
//! read-modify-write under conflicts, a model test, the keyspace conformance
//! suite, and the compatibility page checked against the command table.

mod keyspaces;
mod support;

mod cluster;
mod compat_doc;
mod connection;
mod keys;
mod model;
mod rmw;
mod server;
mod strings;

#[test]
fn mem_keyspace_conforms() {
    rowankv_redis::conformance::run_all(rowankv_redis::MemKeyspace::new);
}
