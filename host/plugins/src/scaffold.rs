//! `crewlet plugins new --kind KIND NAME [--dir DIR]`: a plugin crate that
//! builds for `wasm32-wasip2` out of tree and passes its own test.
//!
//! Rules, and why:
//! - The plugin depends on the same guest SDK the repository's plugins use,
//!   shipped inside this binary ([`SDK_FILES`], embedded file by file by
//!   `build.rs`, so no copy is kept by hand) and written beside the plugin
//!   as `crewlet-sdk/` with the WIT. No registry or git host is needed, and
//!   the plugin's own code is only its logic: the SDK generates the
//!   bindings and carries the HTTP client and error classifier providers
//!   need.
//! - `crewlet-sdk/` mirrors the repository (`plugins/sdk/` beside `wit/`),
//!   so the SDK builds there unchanged; the dependency names the SDK's
//!   version, so a plugin knows which it was made against.
//! - A `Cargo.lock` cut from the guest workspace's ([`lock`]) pins what the
//!   repository's plugins were tested with, so the build is repeatable and
//!   works `--offline` where those plugins were built; `[profile.release]`
//!   is the guest workspace's too (small components, and a build that can
//!   share that workspace's target directory).
//! - The crate is standalone (its own `[workspace]`); its logic sits in
//!   plain functions with native unit tests (`cargo test`), and
//!   `crewlet plugins check DIR` validates its manifest and world once
//!   built. It never overwrites.
//! - It ships what using it takes ([`guide`]): a README with the build,
//!   check and try commands and the names the host uses, a `try.json` for
//!   `crewlet plugins try`, and crewlet's own `rust-toolchain.toml`.

mod guide;
mod lock;
mod templates;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::cli::PluginsError;
use crate::manifest::{Kind, valid_name};
use templates::*;

include!(concat!(env!("OUT_DIR"), "/sdk_files.rs"));

/// The SDK crate's name; a plugin of this name would collide with it.
const SDK_CRATE: &str = "crewlet-plugin-sdk";
const SDK_MANIFEST: &str = include_str!("../../../plugins/sdk/Cargo.toml");
const WORKSPACE_MANIFEST: &str = include_str!("../../../plugins/Cargo.toml");
const WORKSPACE_LOCK: &str = include_str!("../../../plugins/Cargo.lock");

/// The shipped SDK's version (`crewlet-sdk/plugins/sdk/Cargo.toml`).
pub fn sdk_version() -> String {
    let manifest: toml::Table = toml::from_str(SDK_MANIFEST).expect("the SDK manifest is TOML");
    manifest["package"]["version"]
        .as_str()
        .expect("the SDK manifest names its version")
        .to_string()
}

/// The guest workspace's `[profile.release]`, as a manifest section.
fn release_profile() -> String {
    let manifest: toml::Table =
        toml::from_str(WORKSPACE_MANIFEST).expect("the plugins workspace manifest is TOML");
    let mut release = toml::Table::new();
    release.insert("release".into(), manifest["profile"]["release"].clone());
    let mut profile = toml::Table::new();
    profile.insert("profile".into(), toml::Value::Table(release));
    format!(
        "# The repository's plugins build with the same.\n{}",
        toml::to_string(&profile).expect("a TOML table serialises")
    )
}

/// What `scaffold` created.
#[derive(Debug, Clone)]
pub struct ScaffoldReport {
    pub kind: Kind,
    pub name: String,
    /// The new plugin's directory.
    pub dir: PathBuf,
    /// Every file written, relative to `dir`.
    pub files: Vec<PathBuf>,
}

impl fmt::Display for ScaffoldReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = self.dir.display();
        writeln!(f, "created {} plugin `{}` in {dir}", self.kind, self.name)?;
        for file in self.files.iter().filter(|p| !p.starts_with("crewlet-sdk")) {
            writeln!(f, "  {}", file.display())?;
        }
        writeln!(
            f,
            "  crewlet-sdk/ (crewlet-plugin-sdk {} and the WIT it binds)",
            sdk_version()
        )?;
        writeln!(f, "test:  cargo test --manifest-path {dir}/Cargo.toml")?;
        writeln!(
            f,
            "build: cargo build --release --target wasm32-wasip2 --manifest-path {dir}/Cargo.toml"
        )?;
        writeln!(f, "check: crewlet plugins check {dir}")?;
        writeln!(
            f,
            "try:   crewlet plugins try {} --request {dir}/try.json {dir}",
            self.name
        )?;
        writeln!(f, "more:  {dir}/README.md")
    }
}

/// Creates `dir/name/` holding a `kind` plugin named `name`.
pub fn scaffold(kind: Kind, name: &str, dir: &Path) -> Result<ScaffoldReport, PluginsError> {
    if !valid_name(name) {
        return Err(PluginsError::BadName {
            name: name.to_string(),
        });
    }
    let root = dir.join(name);
    if root.exists() {
        return Err(PluginsError::Exists { path: root });
    }
    let krate = format!("crewlet-plugin-{name}");
    if krate == SDK_CRATE {
        return Err(PluginsError::SdkName {
            name: name.to_string(),
        });
    }
    let artifact = krate.replace('-', "_");
    let secret_env = format!(
        "{}_{}",
        name.replace('-', "_").to_uppercase(),
        match kind {
            Kind::Provider => "API_KEY",
            _ => "TOKEN",
        }
    );
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{crate}}", &krate)
            .replace("{{artifact}}", &artifact)
            .replace("{{secret}}", &name.replace('-', "_"))
            .replace("{{secret_env}}", &secret_env)
            .replace("{{sdk_version}}", &sdk_version())
            .replace("{{kind}}", kind.world())
    };
    let (lib, manifest_tail) = match kind {
        Kind::Webhook => (WEBHOOK_LIB, WEBHOOK_MANIFEST),
        Kind::Provider => (PROVIDER_LIB, PROVIDER_MANIFEST),
        Kind::Module => (MODULE_LIB, MODULE_MANIFEST),
    };
    let (try_line, readme_tail, try_request) = match kind {
        Kind::Webhook => (
            guide::WEBHOOK_TRY,
            guide::WEBHOOK_README,
            guide::WEBHOOK_REQUEST,
        ),
        Kind::Provider => (
            guide::PROVIDER_TRY,
            guide::PROVIDER_README,
            guide::PROVIDER_REQUEST,
        ),
        Kind::Module => (
            guide::MODULE_TRY,
            guide::MODULE_README,
            guide::MODULE_REQUEST,
        ),
    };
    let lock = lock::for_plugin(WORKSPACE_LOCK, &krate, SDK_CRATE)
        .expect("the embedded plugins/Cargo.lock holds the SDK (lock.rs tests)");
    let mut files: Vec<(String, String)> = vec![
        (
            "Cargo.toml".to_string(),
            format!("{}{}", fill(CARGO_TOML), release_profile()),
        ),
        ("Cargo.lock".to_string(), lock),
        (
            "plugin.toml".to_string(),
            fill(&format!("{MANIFEST_HEAD}{manifest_tail}")),
        ),
        ("src/lib.rs".to_string(), fill(lib)),
        (".gitignore".to_string(), "/target\n".to_string()),
        (
            "README.md".to_string(),
            fill(&guide::readme(try_line, readme_tail)),
        ),
        ("try.json".to_string(), fill(try_request)),
        ("rust-toolchain.toml".to_string(), guide::rust_toolchain()),
    ];
    for (path, text) in SDK_FILES {
        files.push((path.to_string(), text.to_string()));
    }
    let mut written = Vec::new();
    for (rel, text) in files {
        let path = root.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| PluginsError::Write {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&path, text).map_err(|source| PluginsError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(PathBuf::from(rel));
    }
    Ok(ScaffoldReport {
        kind,
        name: name.to_string(),
        dir: root,
        files: written,
    })
}

#[cfg(test)]
mod tests;
