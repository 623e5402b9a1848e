//! The rule that nothing but the applier writes the replicated estate,
//! held over the repository's source: a write statement naming an estate
//! table outside the applier and the domains it calls fails here, naming
//! the file. (The estate's write half is crate-private too, so no other
//! crate can reach it; readers get SQLite's read-only connection.)
//! The design names exceptions to the rule; there are none yet — add one
//! here only with its reason.

use std::path::{Path, PathBuf};

/// The files allowed to write the estate: the applier's batch (rows,
/// ledger, cursor, lost records), the domains' apply functions it calls,
/// and the estate's own open, install and schema.
const WRITERS: &[&str] = &[
    "host/statelog/src/applier/batch.rs",
    "host/statelog/src/usage/mod.rs",
    "host/statelog/src/estate.rs",
    "host/statelog/migrations/estate.sql",
    "host/statelog/migrations/usage2_slot.sql",
];

const TABLES: &[&str] = &[
    "usage_tokens",
    "usage_turns",
    "usage_schedule_runs",
    "statelog_cursor",
    "statelog_ops",
    "statelog_ops_lost",
];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != ".git" && name != "node_modules" {
                files(&path, out);
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("rs" | "sql")
        ) {
            out.push(path);
        }
    }
}

/// True when `text` holds a write statement naming `table`.
fn writes(text: &str, table: &str) -> bool {
    let upper = text.to_ascii_uppercase();
    let t = table.to_ascii_uppercase();
    ["INSERT INTO ", "INSERT OR REPLACE INTO ", "INSERT OR IGNORE INTO ", "REPLACE INTO ", "UPDATE ", "DELETE FROM "]
        .iter()
        .any(|verb| {
            upper.match_indices(verb).any(|(i, _)| {
                let rest = &upper[i + verb.len()..];
                rest.starts_with(&t) && !rest[t.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
        })
        // The age-out writes through a formatted table name.
        || (upper.contains("DELETE FROM {TABLE}") && text.contains(table))
}

#[test]
fn nothing_but_the_applier_writes_the_replicated_estate() {
    let root = crewlet_testkit::nats::repo_root();
    let mut all = Vec::new();
    for top in ["host", "tests", "benches"] {
        if root.join(top).is_dir() {
            files(&root.join(top), &mut all);
        }
    }
    let this = Path::new(file!()).file_name().unwrap();
    let mut offenders = Vec::new();
    for path in &all {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if WRITERS.contains(&rel.as_str()) || path.file_name() == Some(this) {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for table in TABLES {
            if writes(&text, table) {
                offenders.push(format!("{rel} writes {table}"));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "only the state log's applier writes the estate: {offenders:#?}"
    );
    // The check itself sees a write when there is one.
    assert!(writes(
        "tx.execute(\"INSERT INTO usage_turns (node) VALUES (1)\")",
        "usage_turns"
    ));
    assert!(!writes("SELECT * FROM usage_turns", "usage_turns"));
    assert!(!writes("INSERT INTO statelog_ops_lost", "statelog_ops"));
}
