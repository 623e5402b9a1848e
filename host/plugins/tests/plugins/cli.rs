//! `crewlet plugins check|list|new` as library calls: reports over the
//! repo's plugins, errors naming file and field, and a scaffold that builds
//! and passes its own test.

use crate::common;

use std::process::Command;

use common::{caller, plugins_dir, runtime};
use crewlet_plugins::{Kind, check, list, scaffold};

#[test]
fn check_passes_every_repo_plugin_and_names_the_wrong_world() {
    // The shipped plugins: testdata is not part of a catalogue.
    let report = check(&[plugins_dir()]).unwrap();
    let text = report.to_string();
    assert!(report.is_ok(), "{text}");
    assert!(report.catalogue.is_empty(), "{text}");
    assert_eq!(report.plugins.len(), 13, "{text}");
    assert!(text.contains("ok    github"), "{text}");
    assert!(!text.contains("hostile"), "{text}");

    // The hostile ones, checked on their own: only the wrong world fails
    // validation (the rest misbehave only when run).
    let report = check(&[plugins_dir().join("testdata")]).unwrap();
    let text = report.to_string();
    let failing: Vec<_> = report
        .plugins
        .iter()
        .filter(|p| !p.problems.is_empty())
        .map(|p| p.name.clone().unwrap_or_default())
        .collect();
    assert_eq!(failing, vec!["wrong-world".to_string()], "{text}");
    assert_eq!(report.plugins.len(), 9, "{text}");
    assert!(
        text.contains(
            "supports crewlet:plugin@0.4.2, crewlet:plugin@0.4.1 and crewlet:plugin@0.4.0"
        ),
        "{text}"
    );
}

#[test]
fn check_names_the_file_and_field_of_each_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("plugin.toml"),
        "name = \"bad\"\nversion = \"0.1.0\"\nkind = \"webhook\"\ncomponent = \"bad.wasm\"\n[limits]\ndeadline_ms = 0\n[webhook]\nroutes = [\"/webhooks/bad\"]\n",
    )
    .unwrap();
    let missing = dir.path().join("missing");
    std::fs::create_dir_all(&missing).unwrap();
    std::fs::write(
        missing.join("plugin.toml"),
        "name = \"missing\"\nversion = \"0.1.0\"\nkind = \"module\"\ncomponent = \"nothing.wasm\"\n[module]\nreads = [\"owner.a\"]\n",
    )
    .unwrap();
    let report = check(&[dir.path().to_path_buf()]).unwrap();
    assert!(!report.is_ok());
    let problems = report.problems();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("bad/plugin.toml: field `limits.deadline_ms`"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].contains("missing/plugin.toml: field `component`"),
        "{}",
        problems[1]
    );
    assert!(problems[1].contains("build the plugin"), "{}", problems[1]);
    assert!(check(&[dir.path().join("nope")]).is_err());
}

#[test]
fn symlinked_folders_several_dirs_and_a_wrong_dir_are_each_said() {
    use std::os::unix::fs::symlink;
    let repo = plugins_dir();
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    // A plugin folder linked in from elsewhere is a plugin; a loop back to
    // the top is read once.
    symlink(repo.join("webhooks/github"), a.path().join("github")).unwrap();
    symlink(a.path(), a.path().join("again")).unwrap();
    symlink(repo.join("webhooks/slack"), b.path().join("slack")).unwrap();
    let report = check(&[a.path().to_path_buf(), b.path().to_path_buf()]).unwrap();
    let text = report.to_string();
    assert!(report.is_ok(), "{text}");
    assert_eq!(report.plugins.len(), 2, "{text}");
    assert!(
        text.contains("ok    github") && text.contains("ok    slack"),
        "{text}"
    );

    // The same plugin reached from two dirs is two plugins of one name.
    let report = check(&[a.path().to_path_buf(), a.path().join("github")]).unwrap();
    assert!(
        report
            .catalogue
            .iter()
            .any(|p| p.contains("`github` is also the name")),
        "{report}"
    );

    // A link that leads nowhere is named, never skipped.
    symlink(a.path().join("gone"), b.path().join("broken")).unwrap();
    let err = check(&[b.path().to_path_buf()]).unwrap_err().to_string();
    assert!(
        err.contains("broken") && err.contains("leads nowhere"),
        "{err}"
    );

    // A folder with entries and no manifest is a wrong path, not "0 pass".
    let c = tempfile::tempdir().unwrap();
    std::fs::write(c.path().join("README"), "not a plugin").unwrap();
    let err = check(&[c.path().to_path_buf()]).unwrap_err().to_string();
    assert!(err.contains("holds 1 entry but no plugin.toml"), "{err}");
    // An empty one is an empty catalogue.
    let empty = tempfile::tempdir().unwrap();
    assert!(
        check(&[empty.path().to_path_buf()])
            .unwrap()
            .plugins
            .is_empty()
    );
}

#[test]
fn list_prints_effective_permissions() {
    let text = list(&[plugins_dir()]).unwrap().to_string();
    for expected in [
        "github 0.1.0 (webhook)",
        "serves: /webhooks/github",
        "secrets: github_webhook_secret",
        "outbound http: https://api.openai.com:443",
        "read-write: mod_presence_seen as `seen` (history 1, ttl none)",
        "read-only: mod_presence_seen as `presence.seen`",
        "limits: memory 32 MiB, deadline 500 ms per call",
        "ambient: no env, no sockets, no clock, no filesystem",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// The repository's pinned toolchain, so a scaffold built outside the
/// repository uses it too (and its wasm32-wasip2 target).
fn pinned_toolchain() -> String {
    let text = std::fs::read_to_string(plugins_dir().join("../rust-toolchain.toml")).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    table["toolchain"]["channel"].as_str().unwrap().to_string()
}

fn cargo(args: &[&str], target: &std::path::Path) {
    let out = Command::new("cargo")
        .args(args)
        .env("RUSTUP_TOOLCHAIN", pinned_toolchain())
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaffolded_plugins_pass_their_own_tests_and_a_webhook_and_a_module_build_and_load() {
    let dir = tempfile::tempdir().unwrap();
    // The guest workspace's own target directory, and its release profile
    // (the scaffold copies it, with the workspace's lock): what bootstrap
    // built there for the repository's plugins — wit-bindgen's macro and
    // its toolchain, serde — is reused, not compiled again per scaffold.
    let target = plugins_dir().join("target");
    for (kind, name) in [
        (Kind::Webhook, "acme-hook"),
        (Kind::Provider, "acme-llm"),
        (Kind::Module, "acme-mod"),
    ] {
        let report = scaffold(kind, name, dir.path()).unwrap();
        assert!(
            report
                .to_string()
                .contains("cargo build --release --target wasm32-wasip2")
        );
        let manifest = report.dir.join("Cargo.toml");
        cargo(
            &[
                "test",
                "--release",
                "--quiet",
                "--manifest-path",
                manifest.to_str().unwrap(),
            ],
            &target,
        );
        if kind == Kind::Provider {
            // The shipped SDK's own tests (its error classification among
            // them) pass where a third party gets it.
            cargo(
                &[
                    "test",
                    "--release",
                    "--quiet",
                    "--manifest-path",
                    manifest.to_str().unwrap(),
                    "-p",
                    "crewlet-plugin-sdk",
                ],
                &target,
            );
        }
    }
    assert!(
        scaffold(Kind::Module, "acme-mod", dir.path()).is_err(),
        "never overwrites"
    );
    assert!(scaffold(Kind::Module, "Bad_Name", dir.path()).is_err());

    let hook = build_scaffold(&dir.path().join("acme-hook"), "acme_hook", &target);

    let (rt, _data) = runtime();
    let m = crewlet_plugins::Manifest::load(&hook.join("plugin.toml")).unwrap();
    let plugin = crewlet_plugins::webhook::WebhookPlugin::load(&rt, m).unwrap();
    let req = crewlet_plugins::webhook::Request::new(
        "/webhooks/acme-hook",
        &[("x-acme-hook-token", "t0k"), ("x-request-id", "r1")],
        b"hello",
        &[("acme_hook_token", b"t0k")],
        0,
    );
    assert_eq!(plugin.verify(&req).await.unwrap(), Ok(()));
    let parsed = plugin.parse(&req).await.unwrap().unwrap();
    assert_eq!(parsed.deliveries[0].text.as_deref(), Some("hello"));

    // The module: its manifest subscribes to `turn_ended`, owns `notes`
    // and offers `add-note`, which writes the bucket and publishes.
    let module = build_scaffold(&dir.path().join("acme-mod"), "acme_mod", &target);
    let m = crewlet_plugins::Manifest::load(&module.join("plugin.toml")).unwrap();
    let server = crewlet_testkit::NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let backend: std::sync::Arc<dyn crewlet_plugins::state::StateBackend> =
        std::sync::Arc::new(crewlet_plugins::state::KvState::nats(client.clone()));
    let catalogue = crewlet_plugins::Catalogue {
        plugins: vec![m.clone()],
    };
    crewlet_plugins::module::ensure_buckets(&catalogue, backend.as_ref())
        .await
        .unwrap();
    let mut noted = client
        .subscribe("crewlet.events.module.acme-mod.noted")
        .await
        .unwrap();
    client.flush().await.unwrap();
    let plugin = crewlet_plugins::module::ModulePlugin::start(
        &rt,
        m,
        &catalogue,
        backend.clone(),
        common::nats_bus(&client),
    )
    .await
    .unwrap();
    assert_eq!(
        plugin.subscriptions()[0].source.subject_kind(),
        "turn_ended"
    );
    let answer = plugin
        .call_tool_json("add-note", r#"{"key":"k1","text":"remember"}"#, &caller())
        .await
        .unwrap();
    assert!(
        answer.as_ref().is_ok_and(|a| a.starts_with("noted `k1`")),
        "{answer:?}"
    );
    let stored = backend
        .get("mod_acme-mod_notes", "k1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.value, b"remember");
    let event = futures::StreamExt::next(&mut noted).await.unwrap();
    let event: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
    assert_eq!(event, serde_json::json!({ "key": "k1", "by": "ada" }));
    plugin.on_event("turn_ended", b"{}").await.unwrap().unwrap();
    let count = backend
        .get("mod_acme-mod_notes", "turns-ended")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(count.value, b"1");
}

/// Builds the scaffolded plugin in `root` as its README says (release, for
/// wasm32-wasip2) in the shared `target`, puts the component where its
/// manifest looks, and checks it.
fn build_scaffold(
    root: &std::path::Path,
    artifact: &str,
    target: &std::path::Path,
) -> std::path::PathBuf {
    cargo(
        &[
            "build",
            "--release",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--manifest-path",
            root.join("Cargo.toml").to_str().unwrap(),
        ],
        target,
    );
    let artifact = format!("crewlet_plugin_{artifact}.wasm");
    let built = target.join("wasm32-wasip2/release").join(&artifact);
    let wanted = root.join("target/wasm32-wasip2/release").join(&artifact);
    std::fs::create_dir_all(wanted.parent().unwrap()).unwrap();
    std::fs::copy(&built, &wanted).unwrap();
    let report = check(&[root.to_path_buf()]).unwrap();
    assert!(report.is_ok(), "{report}");
    root.to_path_buf()
}
