//! The load of a chaos run: client threads in the chaos process, each with its
//! own RowanKV client (its own node on the `tcp` fabric, reaching the cluster
//! through the CMs as `rowankv put/get` do), recording every operation in the
//! simulator's history format (`rowankv_sim::history`).
//!
//! Keys are drawn Zipfian from a few hundred, so many clients write the hot
//! keys at once. Every value written is unique (`c<client>-<n>`), so a read
//! names the one write it observed. Outcomes:
//! - answered: `ok` (a GET that finds nothing is `ok` with no output);
//! - no answer, or an error after which the write may have been applied
//!   ([`ClientError::is_unknown`]): `unknown` — never `fail`;
//! - refused without effect (the client's own bounds, a refusal the client
//!   knows changed nothing): `fail`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Zipf};
use rowankv_client::{ClientConfig, ClientError, Op, Output};
use rowankv_deploy::client::{self, Remote};
use rowankv_sim::history::{OpKind, Operation, Status};

/// How long one operation may take before it is given up (outcome unknown).
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// Consecutive errors after which a client thread drops its client and
/// connects anew (a fresh node, a fresh configuration).
const ERRORS_BEFORE_RECONNECT: u32 = 8;

/// Pause between polls of an operation in flight: the client threads share two
/// cores with the whole cluster, so they must not spin.
const POLL_PAUSE: Duration = Duration::from_micros(200);

/// What every client thread shares.
pub struct Load {
    pub cluster_id: u64,
    pub secret: Vec<u8>,
    pub cms: Vec<String>,
    /// The run's clock: `call` and `return` are nanoseconds since this.
    pub start: Instant,
    pub keys: Vec<String>,
    /// Zipf exponent of the key choice.
    pub zipf_s: f64,
    pub seed: u64,
    pub stop: AtomicBool,
}

impl Load {
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn connect(&self) -> Result<Remote, String> {
        let config = ClientConfig {
            timeout: OP_TIMEOUT,
            connect_timeout: OP_TIMEOUT,
            ..ClientConfig::default()
        };
        client::connect(self.cluster_id, &self.secret, &self.cms, config).map_err(|e| e.to_string())
    }
}

/// How far ahead of now a PUT's expiry time is: far past any clock jump (an
/// hour at most) and any run.
const EXPIRY_AHEAD_MS: u64 = 24 * 3600 * 1000;

/// The expiry time of a PUT of `value`: a day from now for about a third of
/// values (chosen by the value), none for the rest. Entries with expiry times
/// take every path a plain one does; no value may expire within a run, so a
/// server that measured expiry against a wrong clock (or stepped its lease
/// clock with its calendar) would lose acknowledged writes.
fn expiry_of(value: &str) -> Option<u64> {
    let h = value
        .bytes()
        .fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b)));
    (h % 3 == 0).then(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        now + EXPIRY_AHEAD_MS
    })
}

/// Run one operation on `remote` and record it as client `client` saw it.
/// `None` from the client (a stuck client past every deadline) is recorded as
/// unknown and the caller drops the client.
pub fn execute(
    load: &Load,
    remote: &mut Remote,
    client: u32,
    op: OpKind,
    key: &str,
    value: Option<String>,
) -> (Operation, bool) {
    let request = match op {
        OpKind::Get => Op::Get {
            key: key.as_bytes().to_vec(),
        },
        OpKind::Put => {
            let value = value.clone().expect("a put has a value");
            Op::Put {
                key: key.as_bytes().to_vec(),
                expires_at_ms: expiry_of(&value),
                value: value.into_bytes(),
            }
        }
        OpKind::Del => Op::Del {
            key: key.as_bytes().to_vec(),
        },
    };
    let mut record = Operation {
        client,
        op,
        key: key.to_string(),
        value,
        output: None,
        call: load.now_ns(),
        ret: 0,
        status: Status::Unknown,
        term: 0,
        final_read: false,
    };
    let id = match remote.client.submit(request) {
        Ok(id) => id,
        Err(e) => {
            // Not sent: nothing can have been applied, unless the client says
            // otherwise.
            record.ret = load.now_ns();
            record.status = if e.is_unknown() {
                Status::Unknown
            } else {
                Status::Fail
            };
            return (record, false);
        }
    };
    // The client gives up at OP_TIMEOUT; this bound only catches a client that
    // never reports at all.
    let deadline = Instant::now() + OP_TIMEOUT * 3;
    let mut out = Vec::new();
    loop {
        out.clear();
        remote.client.poll(&mut out);
        if let Some(c) = out.into_iter().find(|c| c.id == id) {
            record.ret = load.now_ns();
            let (status, output) = match (&c.result, op) {
                (Ok(Output::Value { value, .. }), OpKind::Get) => (
                    Status::Ok,
                    Some(String::from_utf8_lossy(value).into_owned()),
                ),
                (Err(ClientError::NotFound), OpKind::Get | OpKind::Del) => (Status::Ok, None),
                (Ok(Output::Written { .. }), OpKind::Put | OpKind::Del) => (Status::Ok, None),
                // An answer of the wrong shape: the client cannot tell what
                // happened.
                (Ok(_), _) => (Status::Unknown, None),
                (Err(e), _) if e.is_unknown() => (Status::Unknown, None),
                (Err(_), _) => (Status::Fail, None),
            };
            record.status = status;
            record.output = output;
            record.term = if status == Status::Ok { c.term.0 } else { 0 };
            return (record, status != Status::Ok);
        }
        if Instant::now() > deadline {
            record.ret = load.now_ns();
            record.status = Status::Unknown;
            return (record, true);
        }
        out = Vec::new();
        std::thread::sleep(POLL_PAUSE);
    }
}

/// Counts of one client thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadCounts {
    pub connects: u64,
    pub connect_failures: u64,
}

/// One client thread: operations until `load.stop`, every one recorded.
pub fn run_client(load: Arc<Load>, client: u32) -> (Vec<Operation>, ThreadCounts) {
    let mut rng = ChaCha8Rng::seed_from_u64(
        load.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(client),
    );
    let zipf = Zipf::new(load.keys.len() as u64, load.zipf_s)
        .expect("a Zipf exponent checked by the options");
    let mut n = 0u64;
    let keys = load.keys.clone();
    drive(&load, client, Duration::ZERO, move || {
        let key = keys[zipf.sample(&mut rng) as usize - 1].clone();
        let p: f64 = rng.gen();
        if p < 0.45 {
            n += 1;
            (OpKind::Put, key, Some(format!("c{client}-{n}")))
        } else if p < 0.55 {
            (OpKind::Del, key, None)
        } else {
            (OpKind::Get, key, None)
        }
    })
}

/// Pause between the reads of a one-key reader.
const READER_PAUSE: Duration = Duration::from_millis(2);

/// A one-key reader: GETs of `key` only, until `load.stop`, every one recorded.
///
/// The RowanKV client re-reads the configuration only when an operation
/// fails, and the mixed clients above fail soon after any change (a write
/// through a removed primary fails), so they leave a server that answers
/// when it should not only a few milliseconds to be caught. A reader of one
/// key never writes: while the server it reads from answers, it keeps the
/// configuration it has. A server cut off from the CMs must stop answering
/// when its lease ends (then the reader fails, re-reads the configuration and
/// follows the new primary); one that answers on is caught by the
/// stale-configuration check and, once the key is written elsewhere, by the
/// linearizability check. The run starts one reader per server, each on a key
/// whose shard that server led when the load started.
pub fn run_reader(load: Arc<Load>, client: u32, key: String) -> (Vec<Operation>, ThreadCounts) {
    drive(&load, client, READER_PAUSE, move || {
        (OpKind::Get, key.clone(), None)
    })
}

/// The loop of a client thread: the operations `next` chooses, one at a
/// time, each recorded, `pause_ok` after each answered one; a client that
/// fails [`ERRORS_BEFORE_RECONNECT`] times in a row connects anew.
fn drive(
    load: &Load,
    client: u32,
    pause_ok: Duration,
    mut next: impl FnMut() -> (OpKind, String, Option<String>),
) -> (Vec<Operation>, ThreadCounts) {
    let mut history = Vec::new();
    let mut counts = ThreadCounts::default();
    let mut remote: Option<Remote> = None;
    let mut errors = 0u32;
    while !load.stop.load(Ordering::Acquire) {
        let Some(r) = remote.as_mut() else {
            match load.connect() {
                Ok(r) => {
                    counts.connects += 1;
                    remote = Some(r);
                    errors = 0;
                }
                Err(_) => {
                    counts.connect_failures += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            continue;
        };
        let (op, key, value) = next();
        let (record, error) = execute(load, r, client, op, &key, value);
        history.push(record);
        if error {
            errors += 1;
            if errors >= ERRORS_BEFORE_RECONNECT {
                remote = None;
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            errors = 0;
            if !pause_ok.is_zero() {
                std::thread::sleep(pause_ok);
            }
        }
    }
    (history, counts)
}

/// Read every key once more after healing, retrying each until it is
/// answered (`attempts` at most); every attempt is recorded as a final read.
/// Returns the keys that could not be read.
pub fn read_back(
    load: &Load,
    client: u32,
    attempts: u32,
    history: &mut Vec<Operation>,
) -> Vec<String> {
    let mut unread = Vec::new();
    let mut remote: Option<Remote> = None;
    for key in &load.keys {
        let mut done = false;
        for _ in 0..attempts {
            if remote.is_none() {
                match load.connect() {
                    Ok(r) => remote = Some(r),
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    }
                }
            }
            let r = remote.as_mut().expect("connected above");
            let (mut record, error) = execute(load, r, client, OpKind::Get, key, None);
            record.final_read = true;
            let ok = record.status == Status::Ok;
            history.push(record);
            if ok {
                done = true;
                break;
            }
            if error {
                remote = None;
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        if !done {
            unread.push(key.clone());
        }
    }
    unread
}
