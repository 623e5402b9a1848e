//! Every event kind the node records is in `crewlet_bus::EVENT_KINDS`, the
//! vocabulary a module subscribes by: a new kind cannot be forgotten there.
//!
//! The scan reads `host/*/src` (not tests, benches, nor anything from a
//! file's first `#[cfg(test)]` on) for the calls that name a kind with a
//! string literal: `….event("kind", …)` (the publisher), `….emit("kind", …)`
//! (the turn and the model pool) and `announce(ctx, "kind", …)` (the node
//! and the config plane).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The calls that take an event kind, and which argument holds it.
const CALLS: &[(&str, usize)] = &[(".event(", 0), (".emit(", 0), ("announce(", 1)];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source dir") {
        let path = entry.expect("a source dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The top-level arguments of the call whose `(` was just passed.
fn arguments(text: &str) -> Vec<String> {
    let mut args = vec![String::new()];
    let mut depth = 0;
    let mut in_string = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let arg = args.last_mut().expect("one argument at least");
        if in_string {
            arg.push(c);
            match c {
                '\\' => arg.extend(chars.next()),
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => break,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                args.push(String::new());
                continue;
            }
            _ => {}
        }
        args.last_mut().expect("one argument at least").push(c);
    }
    args.into_iter().map(|a| a.trim().to_string()).collect()
}

/// Each kind named by a literal in `text`, with its line.
fn kinds(text: &str) -> Vec<(String, usize)> {
    let code = match text.find("#[cfg(test)]") {
        Some(at) => &text[..at],
        None => text,
    };
    let mut out = Vec::new();
    for (call, index) in CALLS {
        let mut from = 0;
        while let Some(at) = code[from..].find(call).map(|i| from + i) {
            from = at + call.len();
            if code[..at].trim_end().ends_with("fn") {
                continue;
            }
            let args = arguments(&code[from..]);
            let Some(arg) = args.get(*index) else {
                continue;
            };
            if let Some(kind) = arg.strip_prefix('"').and_then(|a| a.strip_suffix('"')) {
                let line = code[..at].lines().count();
                out.push((kind.to_string(), line));
            }
        }
    }
    out
}

#[test]
fn every_event_kind_recorded_in_host_is_in_the_vocabulary() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("host");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&host).expect("read host/") {
        let src = krate.expect("a host/ entry").path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    files.sort();
    let known: BTreeSet<&str> = crewlet_bus::EVENT_KINDS.iter().copied().collect();
    let mut found = BTreeSet::new();
    let mut missing = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a source file");
        for (kind, line) in kinds(&text) {
            if !known.contains(kind.as_str()) {
                missing.push(format!("{}:{line}: `{kind}`", file.display()));
            }
            found.insert(kind);
        }
    }
    assert!(
        missing.is_empty(),
        "event kinds recorded but not in crewlet_bus::EVENT_KINDS (add each, with a line in its table):\n{}",
        missing.join("\n")
    );
    // The scan sees the calls it is meant to: most of the vocabulary is
    // named this way (a scan that found nothing would pass on anything).
    for kind in [
        "webhook_received",
        "turn_ended",
        "schedule_fired",
        "node_started",
        "llm_unavailable",
    ] {
        assert!(found.contains(kind), "the scan missed `{kind}`: {found:?}");
    }
    let unseen: Vec<&&str> = known.iter().filter(|k| !found.contains(**k)).collect();
    assert!(
        unseen.is_empty(),
        "listed but recorded nowhere (remove them): {unseen:?}"
    );
}

#[test]
fn the_scan_reads_a_kind_from_each_call_shape() {
    let text = r#"
        let ev = publisher.event("alpha", json!({"a": [1, 2]}));
        run.emit(
            "beta",
            json!({"x": "a, b"}),
        );
        announce(&self.ctx, "gamma", epoch, &digest).await;
        let kind = p.event(kind, payload);
        pub fn event(&self, kind: &str) {}
        #[cfg(test)]
        publisher.event("delta", json!({}));
    "#;
    let kinds: Vec<String> = kinds(text).into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["alpha", "beta", "gamma"]);
}
