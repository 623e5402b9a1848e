//! `crewlet plugins …` through the real binary, on the repository's plugins.

use crate::common;

use std::path::Path;

use common::*;

fn plugins_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("plugins")
        .display()
        .to_string()
}

#[test]
fn check_passes_on_the_shipped_plugins_and_list_shows_permissions() {
    let (status, out) = run_to_exit(&["plugins", "check", &plugins_dir()], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("all plugins pass"), "{out}");
    assert!(
        !out.contains("hostile"),
        "testdata is not part of a catalogue: {out}"
    );

    let (status, out) = run_to_exit(&["plugins", "list", &plugins_dir()], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("serves: /webhooks/github"), "{out}");
    assert!(
        out.contains("outbound http: https://api.openai.com:443"),
        "{out}"
    );
    assert!(out.contains("read-only: mod_presence_seen"), "{out}");
}

#[test]
fn check_fails_naming_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("broken");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("plugin.toml"),
        "name = \"broken\"\nversion = \"0.1.0\"\nkind = \"webhook\"\ncomponent = \"x.wasm\"\n[webhook]\nroutes = [\"/webhooks/x\"]\nsecretz = []\n",
    )
    .unwrap();
    let (status, out) = run_to_exit(&["plugins", "check", dir.path().to_str().unwrap()], &[]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("broken/plugin.toml"), "{out}");
    assert!(out.contains("secretz"), "{out}");
}

#[test]
fn new_scaffolds_a_plugin_that_check_accepts_as_a_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let (status, out) = run_to_exit(
        &[
            "plugins",
            "new",
            "--kind",
            "webhook",
            "acme-hook",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    let manifest = dir.path().join("acme-hook/plugin.toml");
    assert!(manifest.is_file(), "{out}");

    // A module: its manifest (a subscription, a tool with a schema, a
    // bucket) passes; only the component, not built yet, is missing.
    let (status, out) = run_to_exit(
        &[
            "plugins",
            "new",
            "--kind",
            "module",
            "acme-mod",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(status.success(), "{out}");
    let module = dir.path().join("acme-mod");
    let (status, out) = run_to_exit(&["plugins", "check", module.to_str().unwrap()], &[]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("1 problem(s)"), "{out}");
    assert!(out.contains("field `component`"), "{out}");
    let (status, out) = run_to_exit(&["plugins", "list", module.to_str().unwrap()], &[]);
    assert!(status.success(), "{out}");
    for expected in [
        "subscribes: turn_ended (once)",
        "tool: add-note",
        "publishes: module.acme-mod.noted",
        "read-write: mod_acme-mod_notes",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    let (status, out) = run_to_exit(&["plugins", "new", "--kind", "daemon", "x"], &[]);
    assert_eq!(status.code(), Some(2), "{out}");
}
