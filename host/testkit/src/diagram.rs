//! ARCHITECTURE.md's crate diagram, read as data, and the build graph it
//! must match, for a test that keeps the picture true.
//!
//! Rule: the diagram is the first fenced block under the heading
//! [`HEADING`], one line per fact so a new crate or arrow is one added
//! line (several people add crates at once; lines merge, a redrawn tree
//! does not):
//!
//! ```text
//! crewlet-seats        what the crate is (free text)
//!   -> crewlet-bus     why, if worth saying (free text)
//! ```
//!
//! A line starting at the first column names a crate (its first word) and
//! says what it is; an indented `-> NAME` line is an arrow from the crate
//! named last: a normal (not dev, not build) dependency on another crate of
//! the workspace. Blank lines are ignored; any other line is an error, so
//! the picture never holds a line nobody checks. Every workspace crate is
//! named once, a crate without arrows too.

use std::collections::BTreeSet;
use std::path::Path;

/// The heading whose first fenced block is the crate diagram.
pub const HEADING: &str = "## Crates, and which way dependencies point";

/// Crates and the dependency arrows between them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    pub crates: BTreeSet<String>,
    /// (from, to): `from` depends on `to`.
    pub arrows: BTreeSet<(String, String)>,
}

/// Why ARCHITECTURE.md's crate diagram cannot be read: whoever last edited
/// the page is to blame, and the text names the line and the format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiagramError {
    #[error("no heading {HEADING:?}: the crate diagram goes under it")]
    NoHeading,
    #[error("no fenced block under {HEADING:?}")]
    NoBlock,
    #[error("line {line}: `->` names no crate")]
    ArrowToNothing { line: usize },
    #[error("line {line}: an arrow before any crate line")]
    ArrowFirst { line: usize },
    #[error("line {line}: `{from} -> {to}` is drawn twice")]
    ArrowTwice {
        line: usize,
        from: String,
        to: String,
    },
    #[error("line {line}: an indented line is an arrow `-> CRATE`, found {text:?}")]
    Indented { line: usize, text: String },
    #[error("line {line}: crate {name} is named twice")]
    CrateTwice { line: usize, name: String },
    #[error("the block under {HEADING:?} never closes")]
    Unclosed,
}

/// Reads the diagram out of ARCHITECTURE.md's text. The error names the
/// line (1-based, in the file) that breaks the format and what it should be.
pub fn drawn(markdown: &str) -> Result<Graph, DiagramError> {
    let mut lines = markdown.lines().enumerate();
    lines
        .by_ref()
        .find(|(_, l)| l.trim_end() == HEADING)
        .ok_or(DiagramError::NoHeading)?;
    lines
        .by_ref()
        .find(|(_, l)| l.starts_with("```"))
        .ok_or(DiagramError::NoBlock)?;
    let mut graph = Graph::default();
    let mut from: Option<String> = None;
    for (i, line) in lines {
        if line.starts_with("```") {
            return Ok(graph);
        }
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        let at = i + 1;
        if first == "->" {
            let to = words
                .next()
                .ok_or(DiagramError::ArrowToNothing { line: at })?;
            let from = from.as_ref().ok_or(DiagramError::ArrowFirst { line: at })?;
            if !graph.arrows.insert((from.clone(), to.to_owned())) {
                return Err(DiagramError::ArrowTwice {
                    line: at,
                    from: from.clone(),
                    to: to.to_owned(),
                });
            }
        } else if line.starts_with(char::is_whitespace) {
            return Err(DiagramError::Indented {
                line: at,
                text: line.to_owned(),
            });
        } else {
            if !graph.crates.insert(first.to_owned()) {
                return Err(DiagramError::CrateTwice {
                    line: at,
                    name: first.to_owned(),
                });
            }
            from = Some(first.to_owned());
        }
    }
    Err(DiagramError::Unclosed)
}

/// The workspace's crates and their normal dependencies on each other, as
/// `cargo metadata` reads the manifests of the workspace at `manifest`.
pub fn built(manifest: &Path) -> Graph {
    let cargo = std::env::var("CARGO")
        .ok()
        .or(option_env!("CARGO").map(str::to_owned))
        .unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(&cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(manifest)
        .output()
        .unwrap_or_else(|e| panic!("run {cargo} metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata answers JSON");
    graph_of(&meta)
}

/// [`built`]'s reading of `cargo metadata`'s JSON.
fn graph_of(meta: &serde_json::Value) -> Graph {
    let packages = meta["packages"].as_array().cloned().unwrap_or_default();
    let crates: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let arrows = packages
        .iter()
        .flat_map(|p| {
            let from = p["name"].as_str().unwrap_or_default().to_owned();
            let deps = p["dependencies"].as_array().cloned().unwrap_or_default();
            deps.into_iter()
                .filter(|d| d["kind"].is_null())
                .filter_map(|d| d["name"].as_str().map(str::to_owned))
                .map(move |to| (from.clone(), to))
        })
        .filter(|(_, to)| crates.contains(to))
        .collect();
    Graph { crates, arrows }
}

/// What to change in the picture so it shows `code`: one line per crate
/// or arrow to add or remove; empty when they match.
pub fn fixes(picture: &Graph, code: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for c in code.crates.difference(&picture.crates) {
        out.push(format!(
            "add the crate line `{c}  WHAT IT IS` (a workspace crate the picture does not name)"
        ));
    }
    for c in picture.crates.difference(&code.crates) {
        out.push(format!(
            "remove the crate line `{c}` and its arrows (no workspace crate has that name)"
        ));
    }
    for (from, to) in code.arrows.difference(&picture.arrows) {
        out.push(format!(
            "add `  -> {to}` under `{from}` ({from}'s Cargo.toml depends on it)"
        ));
    }
    for (from, to) in picture.arrows.difference(&code.arrows) {
        out.push(format!(
            "remove `  -> {to}` under `{from}` ({from} has no normal dependency on it)"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(block: &str) -> String {
        format!("# A\n\n{HEADING}\n\nprose\n\n```\n{block}```\n\nmore\n```\nx -> y\n```\n")
    }

    #[test]
    fn crates_and_their_arrows_are_read_from_the_first_block() {
        let g = drawn(&doc(
            "app      the binary\n  -> lib   (why)\n\nlib      a library\n  -> base\nbase\n",
        ))
        .unwrap();
        assert_eq!(
            g.crates,
            ["app", "base", "lib"]
                .map(String::from)
                .into_iter()
                .collect()
        );
        assert_eq!(
            g.arrows,
            [("app", "lib"), ("lib", "base")]
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn a_line_that_is_neither_crate_nor_arrow_is_refused_with_its_number() {
        let err = drawn(&doc("app\n  └─ lib\n")).unwrap_err().to_string();
        assert!(err.starts_with("line 9: an indented line"), "{err}");
        let err = drawn(&doc("  -> lib\n")).unwrap_err().to_string();
        assert!(err.contains("an arrow before any crate line"), "{err}");
        let err = drawn(&doc("app\n  -> lib\n  -> lib\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`app -> lib` is drawn twice"), "{err}");
        assert!(drawn("# no diagram\n").is_err());
    }

    #[test]
    fn the_fixes_name_every_arrow_and_crate_to_add_or_remove() {
        let picture = drawn(&doc("app\n  -> lib\n  -> gone\ngone\nlib\n")).unwrap();
        let meta = serde_json::json!({"packages": [
            {"name": "app", "dependencies": [
                {"name": "lib", "kind": null},
                {"name": "new", "kind": null},
                {"name": "serde", "kind": null},
                {"name": "base", "kind": "dev"},
            ]},
            {"name": "lib", "dependencies": []},
            {"name": "new", "dependencies": [{"name": "lib", "kind": "build"}]},
            {"name": "base", "dependencies": []},
        ]});
        let code = graph_of(&meta);
        assert_eq!(
            fixes(&picture, &code),
            [
                "add the crate line `base  WHAT IT IS` (a workspace crate the picture does not name)",
                "add the crate line `new  WHAT IT IS` (a workspace crate the picture does not name)",
                "remove the crate line `gone` and its arrows (no workspace crate has that name)",
                "add `  -> new` under `app` (app's Cargo.toml depends on it)",
                "remove `  -> gone` under `app` (app has no normal dependency on it)",
            ]
        );
        assert!(fixes(&code, &code).is_empty());
    }
}
