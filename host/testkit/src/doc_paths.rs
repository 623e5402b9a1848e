//! The repository paths a document names, for a test that keeps each one
//! pointing at something that exists.
//!
//! Rule: a path counts when it starts at the repository's root with one of
//! [`ROOTS`] (`host/seats/src/seat.rs`, `tests/e2e/`); a path relative to a
//! section's crate (`lease/mod.rs`) is not checked, and neither is one with
//! a `*`. Braces list alternatives (`engine/{park,budget}.rs` is two paths).

use std::path::Path;

/// The top-level folders a checked path starts with.
pub const ROOTS: [&str; 10] = [
    "host/",
    "tests/",
    "plugins/",
    "scripts/",
    "examples/",
    "benches/",
    "wit/",
    "dashboard/",
    "docs/",
    "migrations/",
];

fn in_path(c: char) -> bool {
    c.is_alphanumeric() || "_./{},*-".contains(c)
}

/// Every path `text` names from the repository's root, braces expanded,
/// in order (repeats kept).
pub fn named(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut prev: Option<char> = None;
    for (at, c) in text.char_indices() {
        let starts = prev.is_none_or(|p| !in_path(p) || p == ',' || p == '{' || p == '}');
        prev = Some(c);
        if !starts || !ROOTS.iter().any(|r| text[at..].starts_with(r)) {
            continue;
        }
        let len = text[at..]
            .find(|c: char| !in_path(c))
            .unwrap_or(text.len() - at);
        let path = text[at..at + len].trim_end_matches(['.', ',']);
        if !path.contains('*') {
            out.extend(expand(path));
        }
    }
    out
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (nested and repeated braces too).
fn expand(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.to_owned()];
    };
    let Some(close) = path[open..].find('}').map(|i| open + i) else {
        return vec![path.to_owned()];
    };
    path[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
        .collect()
}

/// The paths `text` names that do not exist under `root`, each once.
pub fn missing(text: &str, root: &Path) -> Vec<String> {
    let mut out: Vec<String> = named(text)
        .into_iter()
        .filter(|p| !root.join(p).exists())
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_the_root_are_found_with_their_braces_expanded() {
        let text = "see `host/turns/src/engine/{park,budget}.rs`, and host/seats/src/seat.rs. \
            Not `lease/mod.rs`, `/plugins/{name}/state`, nor `migrations/*.sql`; `tests/e2e/`";
        assert_eq!(
            named(text),
            [
                "host/turns/src/engine/park.rs",
                "host/turns/src/engine/budget.rs",
                "host/seats/src/seat.rs",
                "tests/e2e/",
            ]
        );
    }

    #[test]
    fn only_what_is_not_there_is_missing() {
        assert!(named("`src/lib.rs`").is_empty(), "src/ is no root");
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("host/a")).unwrap();
        std::fs::write(dir.path().join("host/a/b.rs"), "").unwrap();
        assert_eq!(
            missing("`host/a/{b,c}.rs` and host/a/", dir.path()),
            ["host/a/c.rs"]
        );
    }
}
