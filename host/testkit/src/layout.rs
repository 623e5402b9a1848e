//! The module graph of one crate's sources, for a test that keeps it free
//! of import circles.
//!
//! Rule: a file's imports point one way. An edge runs from a file to the
//! file of every module it names through `crate::…` or `super::…` (the
//! longest path that is a module file; a module's `mod.rs` counts as that
//! module). Comments and everything from the first `#[cfg(test)]` on are
//! skipped, so doc links and a file's own tests make no edges, and `mod x;`
//! declarations are containment, not imports. A module reaches its
//! submodules (whoever uses it may reach them), and a submodule using its
//! ancestors' items is no edge: that is how one module is split into
//! files, not a circle. Every other edge counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every module file under `src` (a crate's `src` dir) by module path
/// (`""` for the crate root, `a::b` for `src/a/b.rs` or `src/a/b/mod.rs`).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source dir") {
            let path = entry.expect("a source dir entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            out.insert(parts.join("::"), path);
        }
    }
    out
}

/// The module paths one file names, resolved against its own module path.
fn named(text: &str, this: &str) -> BTreeSet<String> {
    let here: Vec<String> = this
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        let code = code.split("//").next().unwrap_or_default();
        // `use x::…` with no anchor names a child module of this one.
        let relative_use = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|p| code.strip_prefix(p));
        if let Some(path) = relative_use
            && !path.starts_with("crate::")
            && !path.starts_with("super::")
            && !path.starts_with("self::")
        {
            paths(path, &here, &mut out);
        }
        for anchor in ["crate::", "super::", "self::"] {
            let mut from = 0;
            while let Some(at) = code[from..].find(anchor).map(|i| from + i) {
                let before = code[..at].chars().last();
                let found = &code[at..];
                from = at + anchor.len();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let base = match anchor {
                    "crate::" => Vec::new(),
                    _ => here.clone(),
                };
                let found = found.strip_prefix("crate::").unwrap_or(found);
                paths(found, &base, &mut out);
            }
        }
    }
    out
}

/// Resolves one path (`super::a::b`, `a::{b, c::d}`, …) from `base` into
/// `out`.
fn paths(path: &str, base: &[String], out: &mut BTreeSet<String>) {
    let mut at = base.to_vec();
    let mut rest = path;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        paths(item.trim(), &at, out);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            paths(item.trim(), &at, out);
            return;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        if word.is_empty() {
            break;
        }
        match word {
            "super" => {
                at.pop();
            }
            "self" => {}
            w => at.push(w.to_owned()),
        }
        match rest[end..].strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    out.insert(at.join("::"));
}

/// The crate's file-level import graph: module path → the modules it uses.
pub fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut graph = BTreeMap::new();
    for (this, file) in &mods {
        let text = std::fs::read_to_string(file).expect("read a source file");
        let mut uses = BTreeSet::new();
        for path in named(&text, this) {
            let mut p: Vec<&str> = path.split("::").collect();
            while !p.is_empty() && !mods.contains_key(&p.join("::")) {
                p.pop();
            }
            let target = p.join("::");
            if !target.is_empty() && !within(this, &target) {
                uses.insert(target);
            }
        }
        uses.extend(
            mods.keys()
                .filter(|m| {
                    m.rsplit_once("::")
                        .map_or(!m.is_empty() && this.is_empty(), |(parent, _)| {
                            parent == this
                        })
                })
                .cloned(),
        );
        graph.insert(this.clone(), uses);
    }
    graph
}

/// Whether `inner` is `outer` or inside it.
fn within(inner: &str, outer: &str) -> bool {
    inner == outer || outer.is_empty() || inner.starts_with(&format!("{outer}::"))
}

/// Every import circle in the crate at `src`, each as the modules on it in
/// order (empty when the graph points one way).
pub fn import_cycles(src: &Path) -> Vec<Vec<String>> {
    let graph = import_graph(src);
    let mut cycles = Vec::new();
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        let mut path = Vec::new();
        walk(&graph, start, &mut path, &mut done, &mut cycles);
    }
    cycles
}

fn walk(
    graph: &BTreeMap<String, BTreeSet<String>>,
    node: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
    cycles: &mut Vec<Vec<String>>,
) {
    if let Some(at) = path.iter().position(|p| p == node) {
        cycles.push(path[at..].to_vec());
        return;
    }
    if done.contains(node) {
        return;
    }
    path.push(node.to_owned());
    for next in graph.get(node).into_iter().flatten() {
        walk(graph, next, path, done, cycles);
    }
    path.pop();
    done.insert(node.to_owned());
}

/// Panics, naming every circle, unless the crate at `src` has none.
pub fn assert_no_import_cycles(src: &Path) {
    let cycles = import_cycles(src);
    assert!(
        cycles.is_empty(),
        "{} has import circles (each file should import one way; move the shared piece down):\n{}",
        src.display(),
        cycles
            .iter()
            .map(|c| format!("  {} -> {}", c.join(" -> "), c[0]))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_circle_through_crate_and_super_paths_is_found() {
        let dir = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a.rs", "use crate::b::Thing;\n"),
            ("b/mod.rs", "pub mod c;\n"),
            (
                "b/c.rs",
                "// crate::a in a comment is no edge\nfn f() { super::super::a::g() }\n",
            ),
        ]);
        // a uses b, which holds c, which uses a.
        let cycles = import_cycles(dir.path());
        assert_eq!(cycles, vec![vec!["a", "b", "b::c"]], "{cycles:?}");
        // A parent and its child using each other are one unit.
        std::fs::write(dir.path().join("b/mod.rs"), "pub mod c;\npub use c::f;\n").unwrap();
        std::fs::write(dir.path().join("b/c.rs"), "use super::Thing;\n").unwrap();
        assert!(import_cycles(dir.path()).is_empty());
    }

    #[test]
    fn tests_comments_and_self_references_make_no_edges() {
        let dir = tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            (
                "a.rs",
                "//! see [`crate::b`]\nfn f() { crate::a::g() }\n#[cfg(test)]\nmod tests { use crate::b; }\n",
            ),
            ("b.rs", "use crate::a;\n"),
        ]);
        assert!(import_cycles(dir.path()).is_empty());
        assert_eq!(
            import_graph(dir.path())["b"],
            BTreeSet::from(["a".to_owned()])
        );
    }
}
