//! COMMAND and the containers' HELP: what clients learn about the commands,
//! answered from the command table.

use rowankv_resp::{errors, Value};

use super::is;
use crate::fail::{fail, Reply};
use crate::glob::Glob;
use crate::session::Call;
use crate::table::{self, CommandSpec, KeyPositions};

/// `COMMAND`: every command's entry.
pub(crate) fn command(_call: &mut Call<'_>) -> Reply {
    Ok(Value::Array(table::commands().iter().map(entry).collect()))
}

/// One command's COMMAND entry, Redis 7's ten fields: name, arity, flags, first
/// key, last key, key step, ACL categories, tips, key specifications,
/// subcommands.
fn entry(spec: &CommandSpec) -> Value {
    let statuses = |words: &[&str]| Value::Set(words.iter().map(|w| Value::simple(w)).collect());
    let KeyPositions { first, last, step } = spec.keys;
    Value::Array(vec![
        Value::bulk(spec.name),
        Value::Integer(spec.arity.into()),
        statuses(spec.flags),
        Value::Integer(first.into()),
        Value::Integer(last.into()),
        Value::Integer(step.into()),
        statuses(spec.acl_categories),
        statuses(spec.tips),
        Value::Array(key_specs(spec)),
        Value::Array(spec.subcommands.iter().map(entry).collect()),
    ])
}

/// The key specification of a command with keys, derived from its key positions:
/// one spec, "index" then "range". Its flags say read-only or read-write only.
fn key_specs(spec: &CommandSpec) -> Vec<Value> {
    let KeyPositions { first, last, step } = spec.keys;
    if first <= 0 {
        return Vec::new();
    }
    let pair = |name: &str, value: Value| (Value::bulk(name), value);
    let flags: &[&str] = if spec.has_flag("readonly") {
        &["RO", "ACCESS"]
    } else {
        &["RW", "UPDATE"]
    };
    let last_relative = if last < 0 { last } else { last - first };
    vec![Value::Map(vec![
        pair(
            "flags",
            Value::Set(flags.iter().map(|f| Value::simple(f)).collect()),
        ),
        pair(
            "begin_search",
            Value::Map(vec![
                pair("type", Value::bulk("index")),
                pair(
                    "spec",
                    Value::Map(vec![pair("index", Value::Integer(first.into()))]),
                ),
            ]),
        ),
        pair(
            "find_keys",
            Value::Map(vec![
                pair("type", Value::bulk("range")),
                pair(
                    "spec",
                    Value::Map(vec![
                        pair("lastkey", Value::Integer(last_relative.into())),
                        pair("keystep", Value::Integer(step.into())),
                        pair("limit", Value::Integer(0)),
                    ]),
                ),
            ]),
        ),
    ])]
}

/// `COMMAND COUNT`: how many top-level commands.
pub(crate) fn count(_call: &mut Call<'_>) -> Reply {
    Ok(Value::Integer(table::commands().len() as i64))
}

/// The command a COMMAND INFO/DOCS argument names: `get`, or `client|setname`.
fn find(name: &[u8]) -> Option<&'static CommandSpec> {
    let mut parts = name.splitn(2, |&b| b == b'|');
    let container = table::lookup(parts.next().unwrap_or_default())?;
    match parts.next() {
        None => Some(container),
        Some(sub) => table::lookup_in(container.subcommands, sub),
    }
}

/// `COMMAND INFO [name ...]`: the entries of the named commands (null for an
/// unknown one), or of all commands.
pub(crate) fn info(call: &mut Call<'_>) -> Reply {
    if call.argv.len() == 2 {
        return command(call);
    }
    Ok(Value::Array(
        call.argv[2..]
            .iter()
            .map(|name| find(name).map_or(Value::Null, entry))
            .collect(),
    ))
}

/// `COMMAND DOCS [name ...]`: summary and group per command (unknown names
/// skipped), subcommands nested as Redis nests them.
pub(crate) fn docs(call: &mut Call<'_>) -> Reply {
    let specs: Vec<&CommandSpec> = if call.argv.len() == 2 {
        table::commands().iter().collect()
    } else {
        call.argv[2..]
            .iter()
            .filter_map(|name| find(name))
            .collect()
    };
    Ok(Value::Map(specs.into_iter().map(doc).collect()))
}

fn doc(spec: &CommandSpec) -> (Value, Value) {
    let pair = |name: &str, value: Value| (Value::bulk(name), value);
    let mut fields = vec![
        pair("summary", Value::bulk(spec.summary)),
        pair("group", Value::bulk(spec.group)),
    ];
    if !spec.subcommands.is_empty() {
        let subs = spec.subcommands.iter().map(doc).collect();
        fields.push(pair("subcommands", Value::Map(subs)));
    }
    (Value::bulk(spec.name), Value::Map(fields))
}

/// `COMMAND LIST [FILTERBY MODULE name|ACLCAT category|PATTERN pattern]`: command
/// and subcommand names (RowanKV has no modules).
pub(crate) fn list(call: &mut Call<'_>) -> Reply {
    let all = table::commands()
        .iter()
        .flat_map(|spec| std::iter::once(spec).chain(spec.subcommands));
    let names: Vec<Value> = match &call.argv[2..] {
        [] => all.map(|spec| Value::bulk(spec.name)).collect(),
        [filterby, kind, value] if is(filterby, "FILTERBY") => {
            let keep: Box<dyn Fn(&CommandSpec) -> bool> = if is(kind, "MODULE") {
                Box::new(|_| false)
            } else if is(kind, "ACLCAT") {
                let category = value.to_ascii_lowercase();
                Box::new(move |spec| {
                    spec.acl_categories
                        .iter()
                        .any(|c| c.trim_start_matches('@').as_bytes() == category.as_slice())
                })
            } else if is(kind, "PATTERN") {
                let glob = Glob::new(&value.to_ascii_lowercase());
                Box::new(move |spec| glob.matches(spec.name.as_bytes()))
            } else {
                return Err(fail(errors::SYNTAX));
            };
            all.filter(|spec| keep(spec))
                .map(|spec| Value::bulk(spec.name))
                .collect()
        }
        _ => return Err(fail(errors::SYNTAX)),
    };
    Ok(Value::Array(names))
}

/// `COMMAND GETKEYS command [arg ...]`: the keys of a request, by the table's key
/// positions.
pub(crate) fn getkeys(call: &mut Call<'_>) -> Reply {
    let argv = &call.argv[2..];
    let Some(container) = table::lookup(&argv[0]) else {
        return Err(fail("ERR Invalid command specified"));
    };
    let spec = match argv.get(1) {
        Some(sub) if !container.subcommands.is_empty() => {
            table::lookup_in(container.subcommands, sub)
                .ok_or_else(|| fail("ERR Invalid command specified"))?
        }
        _ => container,
    };
    if !spec.arity_accepts(argv.len()) {
        return Err(fail(
            "ERR Invalid number of arguments specified for command",
        ));
    }
    let keys = spec.keys(argv);
    if keys.is_empty() {
        return Err(fail("ERR The command has no key arguments"));
    }
    Ok(Value::Array(
        keys.into_iter()
            .map(|key| Value::bulk(key.to_vec()))
            .collect(),
    ))
}

/// `<CONTAINER> HELP`: the container's subcommands and what each does.
pub(crate) fn help(call: &mut Call<'_>) -> Reply {
    let container_name = call.spec.name.split('|').next().unwrap_or_default();
    let container = table::lookup(container_name.as_bytes())
        .expect("a HELP subcommand belongs to a container of the table");
    let upper = container_name.to_ascii_uppercase();
    let mut lines = vec![Value::simple(&format!(
        "{upper} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:"
    ))];
    for sub in container.subcommands {
        let short = sub.name.rsplit('|').next().unwrap_or_default();
        lines.push(Value::simple(&short.to_ascii_uppercase()));
        lines.push(Value::simple(&format!("    {}", sub.summary)));
    }
    Ok(Value::Array(lines))
}
