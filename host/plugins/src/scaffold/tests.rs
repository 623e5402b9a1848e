//! The shipped SDK is the repository's, whole and standalone.

use super::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files_under(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("target") {
                files_under(root, &path, out);
            }
        } else {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            out.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

#[test]
fn every_file_of_the_sdk_and_the_wit_is_shipped_as_it_is() {
    let mut on_disk = Vec::new();
    for (from, to) in [
        ("plugins/sdk", "crewlet-sdk/plugins/sdk"),
        ("wit", "crewlet-sdk/wit"),
    ] {
        let root = repo().join(from);
        let mut files = Vec::new();
        files_under(&root, &root, &mut files);
        on_disk.extend(
            files
                .into_iter()
                .map(|(rel, text)| (format!("{to}/{rel}"), text)),
        );
    }
    assert!(
        on_disk
            .iter()
            .any(|(p, _)| p.ends_with("classify/tests.rs"))
    );
    for (path, text) in &on_disk {
        let shipped = SDK_FILES.iter().find(|(p, _)| p == path);
        assert!(shipped.is_some(), "{path} is not embedded");
        assert!(shipped.is_some_and(|(_, t)| t == text), "{path} is stale");
    }
    assert_eq!(
        SDK_FILES.len(),
        on_disk.len(),
        "a shipped file is gone from disk"
    );
}

#[test]
fn the_sdk_manifest_inherits_nothing_and_keeps_the_workspace_lints() {
    let sdk: toml::Table = toml::from_str(SDK_MANIFEST).unwrap();
    let text = toml::to_string(&sdk).unwrap();
    assert!(
        !text.contains("workspace"),
        "plugins/sdk/Cargo.toml must not inherit from the workspace: it is shipped alone"
    );
    let workspace: toml::Table = toml::from_str(WORKSPACE_MANIFEST).unwrap();
    assert_eq!(sdk["lints"], workspace["workspace"]["lints"]);
    assert_eq!(
        workspace["workspace"]["dependencies"][SDK_CRATE]["version"].as_str(),
        Some(sdk_version().as_str()),
        "the guest workspace depends on the SDK by its version too"
    );
}

#[test]
fn a_plugin_depends_on_the_shipped_sdk_by_path_and_version() {
    let dir = tempfile::tempdir().unwrap();
    let report = scaffold(Kind::Provider, "acme-llm", dir.path()).unwrap();
    let text = std::fs::read_to_string(report.dir.join("Cargo.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let sdk = &manifest["dependencies"][SDK_CRATE];
    assert_eq!(sdk["path"].as_str(), Some("crewlet-sdk/plugins/sdk"));
    assert_eq!(sdk["version"].as_str(), Some(sdk_version().as_str()));
    assert_eq!(sdk["features"], toml::Value::from(vec!["provider"]));
    let workspace: toml::Table = toml::from_str(WORKSPACE_MANIFEST).unwrap();
    assert_eq!(manifest["profile"], workspace["profile"]);
    assert!(
        report
            .dir
            .join("crewlet-sdk/plugins/sdk/src/provider/classify.rs")
            .is_file()
    );
    assert!(report.dir.join("crewlet-sdk/wit/plugin.wit").is_file());
    let shown = report.to_string();
    assert!(
        shown.contains(&format!("crewlet-plugin-sdk {}", sdk_version())),
        "{shown}"
    );
    assert!(
        !shown.contains("classify.rs"),
        "the SDK's files are one line: {shown}"
    );
}

#[test]
fn the_sdks_own_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let error = scaffold(Kind::Module, "sdk", dir.path()).unwrap_err();
    assert!(error.to_string().contains("choose another name"), "{error}");
    assert!(!dir.path().join("sdk").exists());
}

/// The scaffold of `kind` named `name`, written into a fresh temp dir.
fn made(kind: Kind, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let report = scaffold(kind, name, dir.path()).unwrap();
    let root = report.dir.clone();
    let shown = report.to_string();
    assert!(
        shown.contains(&format!("crewlet plugins try {name} --request")),
        "{shown}"
    );
    (dir, root)
}

fn read(root: &Path, file: &str) -> String {
    std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn a_plugin_pins_the_toolchain_crewlets_bootstrap_installs() {
    let (_dir, root) = made(Kind::Webhook, "acme-hook");
    let ours: toml::Table = toml::from_str(&read(&root, "rust-toolchain.toml")).unwrap();
    let repo: toml::Table =
        toml::from_str(&std::fs::read_to_string(repo().join("rust-toolchain.toml")).unwrap())
            .unwrap();
    assert_eq!(ours, repo);
    let targets = ours["toolchain"]["targets"].as_array().unwrap();
    assert!(targets.iter().any(|t| t.as_str() == Some("wasm32-wasip2")));
}

#[test]
fn a_plugin_has_a_readme_with_its_build_check_and_try_commands() {
    for (kind, name) in [
        (Kind::Webhook, "acme-hook"),
        (Kind::Provider, "acme-llm"),
        (Kind::Module, "acme-mod"),
    ] {
        let (_dir, root) = made(kind, name);
        let readme = read(&root, "README.md");
        for line in [
            "cargo test",
            "cargo build --release --target wasm32-wasip2",
            "crewlet plugins check .",
            &format!("crewlet plugins try {name} --request try.json ."),
            "rust-toolchain.toml",
        ] {
            assert!(readme.contains(line), "{kind}: no `{line}` in\n{readme}");
        }
        assert!(!readme.contains("{{"), "{kind}: a hole left in\n{readme}");
    }
}

#[test]
fn each_try_request_is_one_plugins_try_reads_for_its_kind() {
    use crate::trial::module::ModuleInput;
    use crate::trial::provider::CompletionRequest;

    let (_dir, root) = made(Kind::Webhook, "acme-hook");
    let capture: crate::trial::Capture = serde_json::from_str(&read(&root, "try.json")).unwrap();
    assert_eq!(capture.route, "/webhooks/acme-hook");
    assert_eq!(capture.body().unwrap(), b"hello");
    let manifest: toml::Table = toml::from_str(&read(&root, "plugin.toml")).unwrap();
    let secret = manifest["webhook"]["secrets"][0].as_str().unwrap();
    let readme = read(&root, "README.md");
    assert!(
        readme.contains(&format!(
            "{}=t0k crewlet plugins try",
            secret.to_uppercase()
        )),
        "the try line sets the secret by its upper-cased name:\n{readme}"
    );

    let (_dir, root) = made(Kind::Provider, "acme-llm");
    let request: CompletionRequest = serde_json::from_str(&read(&root, "try.json")).unwrap();
    assert_eq!(request.api_key_env.as_deref(), Some("ACME_LLM_API_KEY"));

    let (_dir, root) = made(Kind::Module, "acme-mod");
    let input: ModuleInput = serde_json::from_str(&read(&root, "try.json")).unwrap();
    let ModuleInput::Tool { name, .. } = input else {
        panic!("a tool call");
    };
    let manifest: toml::Table = toml::from_str(&read(&root, "plugin.toml")).unwrap();
    assert!(
        manifest["module"]["tools"].get(&name).is_some(),
        "try.json calls {name}, which the manifest does not declare"
    );
}

#[test]
fn a_modules_tool_is_named_as_a_seat_calls_it() {
    let (_dir, root) = made(Kind::Module, "acme-mod");
    let text = read(&root, "plugin.toml");
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let readme = read(&root, "README.md");
    for tool in manifest["module"]["tools"].as_table().unwrap().keys() {
        // The host offers MODULE__TOOL: the manifest's names, unchanged.
        let offered = format!("acme-mod__{tool}");
        assert!(text.contains(&offered), "plugin.toml never says {offered}");
        assert!(readme.contains(&offered), "README never says {offered}");
    }
    assert!(!text.contains("acme_mod__"), "{text}");
}
