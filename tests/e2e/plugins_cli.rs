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

/// Several plugin folders, one linked in from elsewhere: `check` reads
/// them as one catalogue and `crewlet run` loads every plugin of both; a
/// folder that holds entries but no manifest is refused by both, naming it.
#[test]
fn several_plugin_dirs_and_linked_folders_are_one_catalogue_and_a_wrong_dir_is_refused() {
    use std::os::unix::fs::symlink;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins");
    let sb = Sandbox::new();
    let (a, b, wrong) = (sb.path("a"), sb.path("b"), sb.path("wrong"));
    for d in [&a, &b, &wrong] {
        std::fs::create_dir_all(d).unwrap();
    }
    symlink(repo.join("webhooks/github"), a.join("github")).unwrap();
    symlink(repo.join("providers/scripted"), b.join("scripted")).unwrap();
    std::fs::write(wrong.join("notes.txt"), "not a plugin").unwrap();
    let (a_s, b_s, wrong_s) = (
        a.display().to_string(),
        b.display().to_string(),
        wrong.display().to_string(),
    );

    let (status, out) = run_to_exit(&["plugins", "check", &a_s, &b_s], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("checked 2 plugin(s)"), "{out}");
    let (status, out) = run_to_exit(&["plugins", "check", &wrong_s], &[]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("holds 1 entry but no plugin.toml"), "{out}");

    let mut node = sb
        .node("")
        .arg("--plugins")
        .arg(&a)
        .arg("--plugins")
        .arg(&b)
        .spawn();
    node.wait_ready(std::time::Duration::from_secs(60));
    let view = node.get("/plugins").unwrap().json();
    let mut names: Vec<&str> = view["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["github", "scripted"], "{view}");
    assert_eq!(
        node.health()["plugins_dirs"],
        serde_json::json!([a_s, b_s]),
        "{}",
        node.health()
    );
    drop(node);

    let (status, out) = run_to_exit(
        &[
            "run",
            "--data-dir",
            &sb.path("data2").display().to_string(),
            "--plugins",
            &a_s,
            "--plugins",
            &wrong_s,
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(
        out.contains(&wrong_s) && out.contains("no plugin.toml"),
        "{out}"
    );
}
