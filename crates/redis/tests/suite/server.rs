//! INFO, CONFIG, WAIT, WAITAOF, TIME and COMMAND.

use rowankv_redis::commands;
use rowankv_resp::{errors, Value};

use crate::support::*;

#[test]
fn info_keyspace_counts_keys_with_an_expiry_and_their_mean_ttl() {
    let mut h = Harness::new();
    let keyspace = |h: &mut Harness| {
        text(&h.run(&["INFO", "keyspace"]))
            .lines()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(keyspace(&mut h), "");
    h.run(&["SET", "a", "v"]);
    h.run(&["SET", "b", "v", "PX", "10000"]);
    h.run(&["SET", "c", "v", "PX", "20000"]);
    // Few keys: every one read, the figures exact.
    assert_eq!(keyspace(&mut h), "db0:keys=3,expires=2,avg_ttl=15000");
    h.advance_ms(10_001);
    assert_eq!(keyspace(&mut h), "db0:keys=2,expires=1,avg_ttl=9999");
    h.run(&["PERSIST", "c"]);
    assert_eq!(keyspace(&mut h), "db0:keys=2,expires=0,avg_ttl=0");

    const _: () = assert!(rowankv_redis::KEYSPACE_SAMPLE < 2000);
    // More keys than the sample: a quarter of 2,000 carry 60 s; the share is
    // estimated from KEYSPACE_SAMPLE of them, the TTL is exact (all equal).
    let mut h = Harness::new();
    for i in 0..2000 {
        let key = format!("key:{i}");
        if i % 4 == 0 {
            h.run(&["SET", &key, "v", "PX", "60000"]);
        } else {
            h.run(&["SET", &key, "v"]);
        }
    }
    let line = keyspace(&mut h);
    let fields: Vec<u64> = line
        .trim_start_matches("db0:")
        .split(',')
        .map(|f| f.split('=').nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(fields[0], 2000, "{line}");
    // The binomial standard deviation of 64 draws at p = 1/4 is 3.5 keys of the
    // sample (109 of 2,000); four of them either way is far beyond chance
    // (and the sample's seed is fixed: the figure is the same every run).
    assert!(
        (500 - 4 * 109..=500 + 4 * 109).contains(&fields[1]),
        "{line}"
    );
    assert_eq!(fields[2], 60_000, "{line}");
}

#[test]
fn info_sections() {
    let mut h = Harness::new();
    h.ctx.rowankv = vec![
        ("term".into(), "12".into()),
        ("strategy".into(), "rowan".into()),
        ("dlwa".into(), "1.02".into()),
    ];
    h.ctx.replicas = 2;
    h.run(&["SET", "k", "v"]);
    let all = text(&h.run(&["INFO"]));
    for line in [
        "# Server\r\n",
        "redis_version:7.2.0\r\n",
        "redis_mode:standalone\r\n",
        "\r\n# Clients\r\nconnected_clients:1\r\n",
        "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n",
        "# Keyspace\r\ndb0:keys=1,expires=0,avg_ttl=0\r\n",
        "# RowanKV\r\nterm:12\r\nstrategy:rowan\r\ndlwa:1.02\r\n",
        "cluster_enabled:0\r\n",
    ] {
        assert!(all.contains(line), "{line:?} not in {all}");
    }
    assert!(all.ends_with("\r\n"));
    let some = text(&h.run(&["INFO", "rowankv", "CLIENTS", "nonsense"]));
    assert_eq!(
        some,
        "# Clients\r\nconnected_clients:1\r\n\r\n# RowanKV\r\nterm:12\r\nstrategy:rowan\r\ndlwa:1.02\r\n"
    );
    assert_eq!(text(&h.run(&["INFO", "nonsense"])), "");
    assert_eq!(text(&h.run(&["INFO", "everything"])), all);
    assert!(matches!(h.run(&["INFO"]), Value::Verbatim { .. }));
}

#[test]
fn config() {
    let mut h = Harness::new();
    assert_eq!(
        h.run(&["CONFIG", "GET", "maxmemory"]),
        Value::Map(vec![(bulk("maxmemory"), bulk("0"))])
    );
    assert_eq!(
        h.run(&["CONFIG", "GET", "SAVE", "appendonly", "save"]),
        Value::Map(vec![
            (bulk("appendonly"), bulk("yes")),
            (bulk("save"), bulk(""))
        ])
    );
    let Value::Map(pairs) = h.run(&["CONFIG", "GET", "*"]) else {
        panic!("a map")
    };
    assert!(pairs.contains(&(bulk("databases"), bulk("1"))));
    assert!(pairs.contains(&(bulk("cluster-enabled"), bulk("no"))));
    assert!(!pairs.iter().any(|(k, _)| *k == bulk("requirepass")));
    assert_eq!(h.run(&["CONFIG", "GET", "nothing"]), Value::Map(vec![]));
    assert_eq!(
        h.run(&["CONFIG", "GET"]),
        err("ERR wrong number of arguments for 'config|get' command")
    );
    assert!(is_error_starting(
        &h.run(&["CONFIG", "SET", "maxmemory", "1"]),
        "ERR CONFIG SET is not supported"
    ));
    assert_eq!(
        h.run(&["CONFIG", "REWRITE"]),
        err("ERR unknown subcommand 'REWRITE'. Try CONFIG HELP.")
    );
}

#[test]
fn wait_and_waitaof() {
    let mut h = Harness::new();
    h.ctx.replicas = 2;
    assert_eq!(h.run(&["WAIT", "1", "0"]), int(2));
    assert_eq!(
        h.run(&["WAIT", "5", "100"]),
        int(2),
        "never blocks: no more replicas can come"
    );
    assert_eq!(h.run(&["WAIT", "1", "x"]), err(errors::TIMEOUT_NOT_INTEGER));
    assert_eq!(h.run(&["WAIT", "1", "-1"]), err(errors::TIMEOUT_NEGATIVE));
    assert_eq!(h.run(&["WAIT", "x", "0"]), err(errors::NOT_AN_INTEGER));
    assert_eq!(
        h.run(&["WAIT", "x", "-1"]),
        err(errors::TIMEOUT_NEGATIVE),
        "the timeout is read first"
    );
    assert_eq!(
        h.run(&["WAIT", "1", "9223372036854775807"]),
        err("ERR timeout is out of range")
    );
    assert_eq!(
        h.run(&["WAITAOF", "1", "1", "0"]),
        array(vec![int(1), int(2)])
    );
    assert_eq!(
        h.run(&["WAITAOF", "-1", "1", "0"]),
        err(errors::NOT_POSITIVE)
    );
    assert_eq!(
        h.run(&["WAITAOF", "0", "-1", "0"]),
        err(errors::NOT_POSITIVE)
    );
    assert_eq!(
        h.run(&["WAITAOF", "0", "0", "-1"]),
        err(errors::TIMEOUT_NEGATIVE)
    );
}

#[test]
fn time() {
    let mut h = Harness::new();
    h.ctx.now_ms = 1_700_000_000_123;
    assert_eq!(h.run(&["TIME"]), bulks(&["1700000000", "123000"]));
}

#[test]
fn command_count_and_entries() {
    let mut h = Harness::new();
    assert_eq!(h.run(&["COMMAND", "COUNT"]), int(commands().len() as i64));
    let Value::Array(entries) = h.run(&["COMMAND"]) else {
        panic!("an array")
    };
    assert_eq!(entries.len(), commands().len());
    for entry in &entries {
        let Value::Array(fields) = entry else {
            panic!("{entry:?}")
        };
        assert_eq!(fields.len(), 10, "{entry:?}");
    }
    let info = h.run(&["COMMAND", "INFO", "get", "MSET", "nope", "client|setname"]);
    let Value::Array(infos) = info else {
        panic!("{info:?}")
    };
    assert_eq!(infos.len(), 4);
    let Value::Array(get) = &infos[0] else {
        panic!()
    };
    assert_eq!(get[0], bulk("get"));
    assert_eq!(get[1], int(2));
    assert_eq!(
        get[2],
        Value::Set(vec![Value::simple("readonly"), Value::simple("fast")])
    );
    assert_eq!(&get[3..6], &[int(1), int(1), int(1)]);
    let Value::Array(mset) = &infos[1] else {
        panic!()
    };
    assert_eq!(
        &mset[1..6],
        &[
            int(-3),
            Value::Set(vec![Value::simple("write"), Value::simple("denyoom")]),
            int(1),
            int(-1),
            int(2)
        ]
    );
    assert_eq!(infos[2], Value::Null);
    let Value::Array(setname) = &infos[3] else {
        panic!()
    };
    assert_eq!(setname[0], bulk("client|setname"));
    // The key specification cluster clients read.
    let wire = {
        h.run(&["HELLO", "3"]);
        h.wire(&["COMMAND", "INFO", "get"])
    };
    assert!(
        wire.contains("$12\r\nbegin_search\r\n%2\r\n$4\r\ntype\r\n$5\r\nindex\r\n"),
        "{wire}"
    );
    assert!(wire.contains("~2\r\n+readonly\r\n+fast\r\n"), "{wire}");
}

#[test]
fn command_docs_list_getkeys() {
    let mut h = Harness::new();
    let Value::Map(docs) = h.run(&["COMMAND", "DOCS", "get", "nope"]) else {
        panic!("a map")
    };
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0].0, bulk("get"));
    let Value::Map(all) = h.run(&["COMMAND", "DOCS"]) else {
        panic!()
    };
    assert_eq!(all.len(), commands().len());

    let Value::Array(names) = h.run(&["COMMAND", "LIST"]) else {
        panic!()
    };
    assert!(names.contains(&bulk("get")) && names.contains(&bulk("client|setinfo")));
    assert_eq!(
        h.run(&["COMMAND", "LIST", "FILTERBY", "PATTERN", "pexpire*"]),
        bulks(&["pexpire", "pexpireat", "pexpiretime"])
    );
    let Value::Array(strings) = h.run(&["COMMAND", "LIST", "FILTERBY", "ACLCAT", "string"]) else {
        panic!()
    };
    assert!(strings.contains(&bulk("incr")) && !strings.contains(&bulk("del")));
    assert_eq!(
        h.run(&["COMMAND", "LIST", "FILTERBY", "MODULE", "x"]),
        array(vec![])
    );
    assert_eq!(h.run(&["COMMAND", "LIST", "FILTERBY"]), err(errors::SYNTAX));

    assert_eq!(
        h.run(&["COMMAND", "GETKEYS", "MSET", "a", "1", "b", "2"]),
        bulks(&["a", "b"])
    );
    assert_eq!(
        h.run(&["COMMAND", "GETKEYS", "set", "k", "v", "EX", "1"]),
        bulks(&["k"])
    );
    assert_eq!(
        h.run(&["COMMAND", "GETKEYS", "nope", "k"]),
        err("ERR Invalid command specified")
    );
    assert_eq!(
        h.run(&["COMMAND", "GETKEYS", "get", "a", "b"]),
        err("ERR Invalid number of arguments specified for command")
    );
    assert_eq!(
        h.run(&["COMMAND", "GETKEYS", "ping", "x"]),
        err("ERR The command has no key arguments")
    );
    assert_eq!(
        h.run(&["COMMAND", "NOPE"]),
        err("ERR unknown subcommand 'NOPE'. Try COMMAND HELP.")
    );
    assert!(matches!(h.run(&["COMMAND", "HELP"]), Value::Array(_)));
}
