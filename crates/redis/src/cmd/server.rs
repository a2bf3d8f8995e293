//! Server commands: INFO, CONFIG, WAIT, WAITAOF, TIME.

use std::fmt::Write as _;

use rowankv_resp::{errors, Value};

use super::{int_arg, STRING_BYTES_MAX};
use crate::context::Context;
use crate::fail::{fail, Fail, Reply};
use crate::glob::Glob;
use crate::num::parse_i64;
use crate::session::Call;

/// INFO's sections, in Redis's order, and RowanKV's own last.
const INFO_SECTIONS: &[&str] = &[
    "server",
    "clients",
    "persistence",
    "stats",
    "replication",
    "cluster",
    "keyspace",
    "rowankv",
];

/// `INFO [section ...]`: the named sections (`all`, `everything`, `default` or
/// none: every section). Unknown sections are skipped, as Redis skips them.
pub(crate) fn info(call: &mut Call<'_>) -> Reply {
    let wanted: Vec<&str> = if call.argv.len() == 1
        || call.argv[1..].iter().any(|s| {
            ["all", "everything", "default"]
                .iter()
                .any(|w| s.eq_ignore_ascii_case(w.as_bytes()))
        }) {
        INFO_SECTIONS.to_vec()
    } else {
        INFO_SECTIONS
            .iter()
            .copied()
            .filter(|name| {
                call.argv[1..]
                    .iter()
                    .any(|s| s.eq_ignore_ascii_case(name.as_bytes()))
            })
            .collect()
    };
    let mut text = String::new();
    for name in wanted {
        let lines = section(call, name)?;
        if !text.is_empty() {
            text.push_str("\r\n");
        }
        let title = match name {
            "rowankv" => "RowanKV".to_string(),
            other => other[..1].to_ascii_uppercase() + &other[1..],
        };
        let _ = write!(text, "# {title}\r\n");
        for (field, value) in lines {
            let _ = write!(text, "{field}:{value}\r\n");
        }
    }
    Ok(Value::verbatim_text(text))
}

fn section(call: &mut Call<'_>, name: &str) -> Result<Vec<(String, String)>, Fail> {
    let ctx = call.ctx;
    let line = |field: &str, value: &dyn ToString| (field.to_string(), value.to_string());
    let server = &ctx.server;
    Ok(match name {
        "server" => vec![
            line("redis_version", &server.redis_version),
            line("rowankv_version", &server.version),
            line(
                "redis_mode",
                &if ctx.cluster_mode() {
                    "cluster"
                } else {
                    "standalone"
                },
            ),
            line("arch_bits", &usize::BITS),
            line("run_id", &server.run_id),
            line("tcp_port", &server.tcp_port),
            line("server_time_usec", &ctx.now_ms.saturating_mul(1000)),
            line(
                "uptime_in_seconds",
                &(ctx.now_ms.saturating_sub(server.started_at_ms) / 1000),
            ),
        ],
        "clients" => vec![line("connected_clients", &ctx.connected_clients)],
        "persistence" => vec![
            line("loading", &0),
            line("async_loading", &0),
            line("aof_enabled", &1),
            line("aof_rewrite_in_progress", &0),
            line("rdb_bgsave_in_progress", &0),
        ],
        "stats" => ctx.stats.clone(),
        "replication" => vec![
            line("role", &"master"),
            line("connected_slaves", &ctx.replicas),
        ],
        "cluster" => vec![line("cluster_enabled", &u8::from(ctx.cluster_mode()))],
        "keyspace" => {
            let stats = keyspace_stats(call, ctx.now_ms)?;
            if stats.keys == 0 {
                Vec::new()
            } else {
                vec![line(
                    "db0",
                    &format!(
                        "keys={},expires={},avg_ttl={}",
                        stats.keys, stats.expires, stats.avg_ttl_ms
                    ),
                )]
            }
        }
        "rowankv" => ctx.rowankv.clone(),
        other => unreachable!("INFO_SECTIONS has no {other}"),
    })
}

/// Keys INFO keyspace reads whole (value and expiry) to estimate `expires` and
/// `avg_ttl`; with no more keys than this both are exact.
pub const KEYSPACE_SAMPLE: usize = 64;

/// INFO keyspace's `db0` line.
#[derive(Debug, PartialEq, Eq)]
struct KeyspaceStats {
    keys: u64,
    expires: u64,
    avg_ttl_ms: u64,
}

/// Counts the keys by a SCAN of the node's part of the keyspace (the cost of
/// DBSIZE), and reads [`KEYSPACE_SAMPLE`] of them, chosen uniformly (a
/// reservoir), for the share with an expiry and their mean remaining time. Redis
/// counts `expires` exactly and estimates `avg_ttl` from a sample; here both
/// come from the sample once there are more keys than it holds.
fn keyspace_stats(call: &mut Call<'_>, now_ms: u64) -> Result<KeyspaceStats, Fail> {
    let mut sample: Vec<Vec<u8>> = Vec::with_capacity(KEYSPACE_SAMPLE);
    let (mut cursor, mut keys) = (0u64, 0u64);
    // A fixed-seed xorshift: the sample need not be unpredictable, only spread.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    loop {
        let (next, page) = call.keyspace.scan(cursor, 10_000, now_ms)?;
        for key in page {
            keys += 1;
            if sample.len() < KEYSPACE_SAMPLE {
                sample.push(key);
            } else {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let at = rng % keys;
                if let Some(slot) = sample.get_mut(at as usize) {
                    *slot = key;
                }
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let (mut read, mut with_ttl, mut ttl_sum) = (0u64, 0u64, 0u128);
    for key in &sample {
        // A key deleted or expired since the scan is left out of the sample.
        let Some(record) = call.keyspace.get(key, now_ms)? else {
            continue;
        };
        read += 1;
        if let Some(at) = record.expires_at_ms {
            with_ttl += 1;
            ttl_sum += u128::from(at.saturating_sub(now_ms));
        }
    }
    if read == 0 {
        return Ok(KeyspaceStats {
            keys,
            expires: 0,
            avg_ttl_ms: 0,
        });
    }
    let expires = if read == keys {
        with_ttl
    } else {
        ((u128::from(keys) * u128::from(with_ttl) + u128::from(read) / 2) / u128::from(read)) as u64
    };
    let avg_ttl_ms = if with_ttl == 0 {
        0
    } else {
        (ttl_sum / u128::from(with_ttl)) as u64
    };
    Ok(KeyspaceStats {
        keys,
        expires,
        avg_ttl_ms,
    })
}

/// The parameters CONFIG GET answers, read-only.
fn config_parameters(ctx: &Context) -> Vec<(&'static str, String)> {
    let yes_no = |on: bool| if on { "yes" } else { "no" }.to_string();
    vec![
        ("maxmemory", "0".to_string()),
        ("maxmemory-policy", "noeviction".to_string()),
        ("appendonly", yes_no(true)),
        ("appendfsync", "always".to_string()),
        ("save", String::new()),
        ("databases", "1".to_string()),
        ("cluster-enabled", yes_no(ctx.cluster_mode())),
        ("port", ctx.server.tcp_port.to_string()),
        ("timeout", "0".to_string()),
        ("proto-max-bulk-len", STRING_BYTES_MAX.to_string()),
        ("notify-keyspace-events", String::new()),
        ("maxclients", "10000".to_string()),
    ]
}

/// `CONFIG GET pattern [pattern ...]`: the parameters matching any pattern (ASCII
/// case ignored, as Redis), each once.
pub(crate) fn config_get(call: &mut Call<'_>) -> Reply {
    let patterns: Vec<Glob> = call.argv[2..]
        .iter()
        .map(|p| Glob::new(&p.to_ascii_lowercase()))
        .collect();
    let pairs = config_parameters(call.ctx)
        .into_iter()
        .filter(|(name, _)| patterns.iter().any(|glob| glob.matches(name.as_bytes())))
        .map(|(name, value)| (Value::bulk(name), Value::bulk(value)))
        .collect();
    Ok(Value::Map(pairs))
}

pub(crate) fn config_set(_call: &mut Call<'_>) -> Reply {
    Err(fail(
        "ERR CONFIG SET is not supported: RowanKV's configuration is read-only over RESP",
    ))
}

/// A timeout argument as Redis's `getTimeoutFromObjectOrReply` reads one (in
/// milliseconds, for WAIT and WAITAOF).
fn timeout_ms(arg: &[u8], now_ms: u64) -> Result<i64, Fail> {
    let timeout = parse_i64(arg).ok_or_else(|| fail(errors::TIMEOUT_NOT_INTEGER))?;
    if timeout < 0 {
        return Err(fail(errors::TIMEOUT_NEGATIVE));
    }
    let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
    if timeout > 0 && timeout > i64::MAX - now {
        return Err(fail("ERR timeout is out of range"));
    }
    Ok(timeout)
}

/// `WAIT numreplicas timeout`: answered at once with the number of replicas,
/// because every write RowanKV acknowledged is already durable on all of them.
pub(crate) fn wait(call: &mut Call<'_>) -> Reply {
    timeout_ms(&call.argv[2], call.ctx.now_ms)?;
    int_arg(&call.argv[1])?;
    Ok(Value::Integer(replicas(call.ctx)))
}

/// `WAITAOF numlocal numreplicas timeout`: answered at once, `[1, replicas]`: an
/// acknowledged write is already persistent here and on every replica.
pub(crate) fn waitaof(call: &mut Call<'_>) -> Reply {
    timeout_ms(&call.argv[3], call.ctx.now_ms)?;
    for arg in [&call.argv[1], &call.argv[2]] {
        if int_arg(arg)? < 0 {
            return Err(fail(errors::NOT_POSITIVE));
        }
    }
    Ok(Value::Array(vec![
        Value::Integer(1),
        Value::Integer(replicas(call.ctx)),
    ]))
}

fn replicas(ctx: &Context) -> i64 {
    i64::try_from(ctx.replicas).unwrap_or(i64::MAX)
}

/// `TIME`: the context's time, as seconds and microseconds.
pub(crate) fn time(call: &mut Call<'_>) -> Reply {
    let now = call.ctx.now_ms;
    Ok(Value::Array(vec![
        Value::bulk((now / 1000).to_string()),
        Value::bulk(((now % 1000) * 1000).to_string()),
    ]))
}
