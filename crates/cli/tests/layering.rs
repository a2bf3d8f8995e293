//! The workspace's layering, as `docs/architecture.md` states it: every crate is
//! in the table with its layer, and no crate depends (in `[dependencies]`; tests
//! may reach higher) on a crate of a higher layer.

use std::collections::BTreeMap;
use std::path::Path;

/// Layer of each crate, from the table's rows `| N | `crate` | … |` (`5–6`
/// counts as 6).
fn layers(doc: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        let Some(layer) = cells[1]
            .split(['–', '-'])
            .filter_map(|n| n.parse::<u32>().ok())
            .max()
        else {
            continue;
        };
        if let Some(name) = cells[2].strip_prefix('`').and_then(|c| c.strip_suffix('`')) {
            out.insert(name.to_string(), layer);
        }
    }
    out
}

/// The crate's name and the workspace crates in its `[dependencies]`.
fn dependencies(manifest: &str) -> (String, Vec<String>) {
    let mut name = String::new();
    let mut deps = Vec::new();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        let key = line.split(['=', '.']).next().unwrap_or("").trim();
        if section == "[package]" && key == "name" {
            name = line.split('"').nth(1).unwrap_or("").to_string();
        }
        if section == "[dependencies]" && key.starts_with("rowankv") {
            deps.push(key.to_string());
        }
    }
    (name, deps)
}

#[test]
fn no_crate_depends_on_a_higher_layer_and_the_table_names_every_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let layers = layers(&doc);
    assert!(layers.len() >= 10, "the table was not read: {layers:?}");
    let mut checked = 0;
    let mut broken = Vec::new();
    for dir in std::fs::read_dir(root.join("crates")).unwrap() {
        let manifest = dir.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let (name, deps) = dependencies(&text);
        let Some(&layer) = layers.get(&name) else {
            panic!(
                "{name} ({}) is not in docs/architecture.md's table",
                manifest.display()
            );
        };
        for d in deps {
            let Some(&dl) = layers.get(&d) else {
                panic!("{name} depends on {d}, which the table does not name");
            };
            if dl > layer {
                broken.push(format!("{name} (layer {layer}) → {d} (layer {dl})"));
            }
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} crates found");
    assert!(
        broken.is_empty(),
        "dependencies on higher layers: {broken:#?}"
    );
}

#[test]
fn a_dependency_on_a_higher_layer_is_found() {
    let table = "| 0 | `low` | x |\n| 5–6 | `high` | y |";
    let layers = layers(table);
    assert_eq!(layers["low"], 0);
    assert_eq!(layers["high"], 6);
    let (name, deps) = dependencies(
        "[package]\nname = \"rowankv-low\"\n[dependencies]\nrowankv-high.workspace = true\nserde = \"1\"\n[dev-dependencies]\nrowankv-x.workspace = true\n",
    );
    assert_eq!(name, "rowankv-low");
    assert_eq!(deps, vec!["rowankv-high".to_string()]);
}
