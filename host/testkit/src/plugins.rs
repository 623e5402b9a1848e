//! A plugins dir for one test: manifests of the project's built plugins,
//! each copied with its component beside it (a manifest names its component
//! relative to its own directory), optionally edited — e.g. a provider
//! pointed at a local server instead of its vendor.

use std::path::{Path, PathBuf};

use crate::nats::repo_root;

/// Builds plugin dirs under one root.
pub struct PluginsDir {
    dir: PathBuf,
}

impl PluginsDir {
    pub fn new(dir: impl Into<PathBuf>) -> PluginsDir {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).expect("create the plugins dir");
        PluginsDir { dir }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Adds the plugin whose manifest is `manifest` (relative to the repo
    /// root) as `name`.
    pub fn add(&self, name: &str, manifest: &str) -> &Self {
        self.add_edited(name, manifest, |t| t)
    }

    /// Adds the plugin of `manifest` as `name` with a per-call deadline of
    /// `ms` (for a test whose plugin does real work under a loaded machine).
    pub fn add_with_deadline(&self, name: &str, manifest: &str, ms: u64) -> &Self {
        self.add_edited(name, manifest, |text| {
            text.lines()
                .map(|l| {
                    if l.starts_with("deadline_ms") {
                        format!("deadline_ms = {ms}")
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    /// Adds a provider plugin whose `base_url` and only outbound host are
    /// `origin` (`http://127.0.0.1:PORT`) with `base_url` under it.
    pub fn add_provider_at(
        &self,
        name: &str,
        manifest: &str,
        base_url: &str,
        origin: &str,
    ) -> &Self {
        self.add_edited(name, manifest, |text| {
            text.lines()
                .map(|l| {
                    if l.starts_with("base_url") {
                        format!("base_url = {base_url:?}")
                    } else if l.starts_with("allowed_outbound_hosts") {
                        format!("allowed_outbound_hosts = [{origin:?}]")
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    fn add_edited(&self, name: &str, manifest: &str, edit: impl Fn(String) -> String) -> &Self {
        let src = repo_root().join(manifest);
        let text =
            std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let into = self.dir.join(name);
        std::fs::create_dir_all(&into).expect("create the plugin's dir");
        let base = src.parent().expect("a manifest has a dir");
        let text: String = text
            .lines()
            .map(|l| match l.strip_prefix("component = \"") {
                Some(rest) => {
                    let built = base.join(rest.trim_end_matches('"'));
                    std::fs::copy(&built, into.join("component.wasm")).unwrap_or_else(|e| {
                        panic!(
                            "{}: {e}; build the plugins first (./dev test does)",
                            built.display()
                        )
                    });
                    "component = \"component.wasm\"".to_owned()
                }
                None => l.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(into.join("plugin.toml"), edit(text)).expect("write the manifest");
        self
    }
}
