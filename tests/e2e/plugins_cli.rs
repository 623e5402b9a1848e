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

/// `plugins new` out of tree: a webhook and a provider, made in a temp
/// dir with nothing of the repository's beside them, build for
/// wasm32-wasip2 with plain cargo, offline (the shipped `Cargo.lock` pins
/// what the repository's plugins were built with), and pass `plugins
/// check`; an unbuilt module's manifest passes but for its component.
#[test]
fn new_plugins_build_out_of_tree_on_the_shipped_sdk_and_pass_check() {
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap();
    for (kind, name) in [
        ("webhook", "acme-hook"),
        ("provider", "acme-llm"),
        ("module", "acme-mod"),
    ] {
        let (status, out) = run_to_exit(
            &["plugins", "new", "--kind", kind, name, "--dir", dir_s],
            &[],
        );
        assert!(status.success(), "{out}");
        assert!(out.contains("crewlet-sdk/ (crewlet-plugin-sdk "), "{out}");
        assert!(dir.path().join(name).join("plugin.toml").is_file(), "{out}");
    }

    // A module: its manifest (a subscription, a tool with a schema, a
    // bucket) passes; only the component, not built yet, is missing.
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
    std::fs::remove_dir_all(&module).unwrap();

    for (name, artifact) in [("acme-hook", "acme_hook"), ("acme-llm", "acme_llm")] {
        build_out_of_tree(&dir.path().join(name), artifact);
    }
    let (status, out) = run_to_exit(&["plugins", "check", dir_s], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("checked 2 plugin(s)"), "{out}");
    assert!(out.contains("all plugins pass"), "{out}");
    let (status, out) = run_to_exit(&["plugins", "list", dir_s], &[]);
    assert!(status.success(), "{out}");
    assert!(out.contains("acme-llm 0.1.0 (provider)"), "{out}");
    assert!(out.contains("serves: /webhooks/acme-hook"), "{out}");
}

/// `cargo build --release --offline --target wasm32-wasip2` of the plugin
/// in `root`, with the repository's pinned toolchain (the temp dir has no
/// rust-toolchain.toml) and the guest workspace's target directory (the
/// plugin's release profile is that workspace's, so what both build is
/// compiled once); the component is then put where its manifest says.
fn build_out_of_tree(root: &Path, artifact: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let toolchain = std::fs::read_to_string(repo.join("rust-toolchain.toml")).unwrap();
    let toolchain = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .unwrap()
        .trim_matches('"');
    let target = repo.join("plugins/target");
    let out = std::process::Command::new("cargo")
        .args([
            "build",
            "--release",
            "--offline",
            "--quiet",
            "--target",
            "wasm32-wasip2",
        ])
        .current_dir(root)
        .env("RUSTUP_TOOLCHAIN", toolchain)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo build of {} failed:\n{}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let file = format!("crewlet_plugin_{artifact}.wasm");
    let wanted = root.join("target/wasm32-wasip2/release").join(&file);
    std::fs::create_dir_all(wanted.parent().unwrap()).unwrap();
    std::fs::copy(target.join("wasm32-wasip2/release").join(&file), &wanted).unwrap();
}

/// Several plugin folders, one linked in from elsewhere: `check` reads
/// them as one catalogue and `crewlet run` loads every plugin of both; a
/// folder that holds entries but no manifest is refused by both, naming it.
/// The names of the plugins `node` serves, sorted.
fn plugin_names(node: &common::Node) -> Vec<String> {
    let view = node.get("/plugins").unwrap().json();
    let mut names: Vec<String> = view["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

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
    assert_eq!(plugin_names(&node), ["github", "scripted"]);
    assert_eq!(
        node.health()["plugins_dirs"],
        serde_json::json!([a_s, b_s]),
        "{}",
        node.health()
    );
    drop(node);

    // The node's file lists folders too (relative to the file, read before
    // any --plugins).
    let mut node = sb
        .node("[plugins]\ndirs = [\"a\"]\n")
        .arg("--plugins")
        .arg(&b)
        .spawn();
    node.wait_ready(std::time::Duration::from_secs(60));
    assert_eq!(plugin_names(&node), ["github", "scripted"]);
    let dirs = node.health()["plugins_dirs"].clone();
    let dirs: Vec<&str> = dirs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .collect();
    assert_eq!(dirs.len(), 2, "{dirs:?}");
    assert!(
        dirs[0].ends_with("/a") && dirs[1] == b_s,
        "the file's folder first: {dirs:?}"
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
