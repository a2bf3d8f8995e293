//! `docs/redis-compatibility.md` against the command table: every command and
//! subcommand of the table has one row with its status, and every row names a
//! command of the table, so the page cannot drift from the code.

use std::collections::BTreeMap;

use rowankv_redis::commands;

const PAGE: &str = include_str!("../../../../docs/redis-compatibility.md");

/// The rows of the page's command table: `| `NAME` | status | difference |`.
fn rows() -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in PAGE.lines() {
        let Some(rest) = line.strip_prefix("| `") else {
            continue;
        };
        let cells: Vec<&str> = rest.split('|').map(str::trim).collect();
        assert!(cells.len() >= 3, "a row has three cells: {line}");
        let name = cells[0].trim_end_matches('`').to_string();
        let previous = rows.insert(name.clone(), cells[1].to_string());
        assert!(previous.is_none(), "{name} has two rows");
    }
    rows
}

/// The table's commands as the page names them: `GET`, `CLIENT SETNAME`.
fn table() -> BTreeMap<String, &'static str> {
    let mut names = BTreeMap::new();
    for spec in commands() {
        names.insert(spec.name.to_ascii_uppercase(), spec.status.as_str());
        for sub in spec.subcommands {
            names.insert(
                sub.name.replace('|', " ").to_ascii_uppercase(),
                sub.status.as_str(),
            );
        }
    }
    names
}

#[test]
fn every_command_has_a_row_with_its_status() {
    let rows = rows();
    for (name, status) in table() {
        let row = rows
            .get(&name)
            .unwrap_or_else(|| panic!("docs/redis-compatibility.md has no row for {name}"));
        assert_eq!(row, status, "{name}'s status on the page");
    }
}

#[test]
fn every_row_names_a_command() {
    let table = table();
    for name in rows().keys() {
        assert!(
            table.contains_key(name),
            "the page's row {name} names no command of the table"
        );
    }
}
