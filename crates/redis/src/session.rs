//! [`Session`]: one client connection's state, and the path of every request
//! through the command layer.
//!
//! `execute` checks a request in Redis's order — the command exists, its arity,
//! authentication, then (in cluster mode) that its keys share a slot — and only
//! then runs the command's handler, so that the error a client sees for a bad
//! request is the one Redis would send.

use rowankv_resp::{errors, key_slot, Protocol, Request, Value};

use crate::context::Context;
use crate::keyspace::Keyspace;
use crate::table::{self, CommandSpec};

/// One client connection: protocol, authentication, name.
#[derive(Clone, Debug)]
pub struct Session {
    pub(crate) id: u64,
    pub(crate) protocol: Protocol,
    /// Whether AUTH (or HELLO AUTH) succeeded; meaningful only while the server
    /// has a password.
    pub(crate) authenticated: bool,
    pub(crate) name: Option<Vec<u8>>,
    pub(crate) lib_name: Option<Vec<u8>>,
    pub(crate) lib_ver: Option<Vec<u8>>,
    pub(crate) peer_addr: Option<String>,
    pub(crate) local_addr: Option<String>,
}

/// What a request produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The replies to write, in order, in the session's protocol
    /// ([`Session::protocol`] after the call): one per request.
    pub replies: Vec<Value>,
    /// Close the connection once the replies are written (QUIT).
    pub close: bool,
}

impl Session {
    /// A new connection with the server-wide unique `id` (CLIENT ID, HELLO's `id`).
    pub fn new(id: u64) -> Session {
        Session {
            id,
            protocol: Protocol::Resp2,
            authenticated: false,
            name: None,
            lib_name: None,
            lib_ver: None,
            peer_addr: None,
            local_addr: None,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The protocol to encode replies in (RESP2 until `HELLO 3`).
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Whether the connection may run commands: the server has no password, or
    /// the connection authenticated. (The server also tells its request parser,
    /// which applies Redis's tighter limits before authentication.)
    pub fn is_authenticated(&self, ctx: &Context) -> bool {
        ctx.requirepass.is_none() || self.authenticated
    }

    /// The name set by CLIENT SETNAME or HELLO SETNAME.
    pub fn name(&self) -> Option<&[u8]> {
        self.name.as_deref()
    }

    /// The library name and version set by CLIENT SETINFO.
    pub fn lib(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        (self.lib_name.as_deref(), self.lib_ver.as_deref())
    }

    /// The connection's addresses (`ip:port`), for CLIENT INFO.
    pub fn set_addresses(&mut self, peer: impl Into<String>, local: impl Into<String>) {
        self.peer_addr = Some(peer.into());
        self.local_addr = Some(local.into());
    }

    /// Runs one request against `keyspace` at `ctx.now_ms`.
    pub fn execute(
        &mut self,
        request: &Request,
        keyspace: &mut dyn Keyspace,
        ctx: &Context,
    ) -> Outcome {
        let argv = request.argv();
        let spec = match resolve(argv) {
            Ok(spec) => spec,
            Err(reply) => return Outcome::one(reply),
        };
        if let Err(reply) = self.admit(spec, argv, ctx) {
            return Outcome::one(reply);
        }
        let handler = spec
            .handler
            .expect("resolve returns only commands with a handler");
        let mut call = Call {
            session: self,
            keyspace,
            ctx,
            argv,
            spec,
            close: false,
        };
        let reply = handler(&mut call).unwrap_or_else(|fail| fail.into_reply(ctx.cluster_mode()));
        Outcome {
            close: call.close,
            replies: vec![reply],
        }
    }

    /// The checks Redis makes after finding the command and before running it.
    fn admit(&self, spec: &CommandSpec, argv: &[Vec<u8>], ctx: &Context) -> Result<(), Value> {
        if !self.is_authenticated(ctx) && !spec.has_flag("no_auth") {
            return Err(Value::error(errors::NOAUTH));
        }
        if ctx.cluster_mode() {
            let mut slots = spec.keys(argv).into_iter().map(key_slot);
            if let Some(first) = slots.next() {
                if slots.any(|slot| slot != first) {
                    return Err(Value::error(errors::CROSSSLOT));
                }
            }
        }
        Ok(())
    }
}

impl Outcome {
    fn one(reply: Value) -> Outcome {
        Outcome {
            replies: vec![reply],
            close: false,
        }
    }
}

/// The command (or subcommand) `argv` names, with its arity checked; or the error
/// Redis answers for an unknown command, unknown subcommand or wrong arity.
pub(crate) fn resolve(argv: &[Vec<u8>]) -> Result<&'static CommandSpec, Value> {
    let name = &argv[0];
    let Some(container) = table::lookup(name) else {
        return Err(errors::unknown_command(name, &argv[1..]));
    };
    let spec = match (container.subcommands.is_empty(), argv.get(1)) {
        (true, _) => container,
        // A container called alone runs itself if it can (COMMAND), else fails
        // its own arity check below (CLIENT needs a subcommand).
        (false, None) => container,
        (false, Some(sub)) => match table::lookup_in(container.subcommands, sub) {
            Some(spec) => spec,
            None => return Err(errors::unknown_subcommand(container.name, sub)),
        },
    };
    if !spec.arity_accepts(argv.len()) || spec.handler.is_none() {
        return Err(errors::wrong_number_of_arguments(spec.name));
    }
    Ok(spec)
}

/// One call of a command handler: the session, the keyspace, the context and the
/// request's words.
pub(crate) struct Call<'a> {
    pub(crate) session: &'a mut Session,
    pub(crate) keyspace: &'a mut dyn Keyspace,
    pub(crate) ctx: &'a Context,
    /// Name (or container and subcommand names) first, as sent.
    pub(crate) argv: &'a [Vec<u8>],
    pub(crate) spec: &'static CommandSpec,
    /// Set by QUIT: close the connection after the reply.
    pub(crate) close: bool,
}

impl Call<'_> {
    pub(crate) fn now_ms(&self) -> u64 {
        self.ctx.now_ms
    }

    /// The command's full name as Redis spells it in errors (`get`, `client|setname`).
    pub(crate) fn command(&self) -> &'static str {
        self.spec.name
    }
}

/// Sets the connection's state as a new connection has it (RESET).
pub(crate) fn reset(session: &mut Session) {
    let id = session.id;
    let (peer, local) = (session.peer_addr.take(), session.local_addr.take());
    *session = Session::new(id);
    session.peer_addr = peer;
    session.local_addr = local;
}
