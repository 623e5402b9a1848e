//! What `crewlet plugins check|list` run; the `crewlet` binary only prints
//! the reports.
//!
//! `check` validates without running anything: every manifest, the
//! catalogue between them, and every component's world against its
//! manifest's kind (which compiles the component but calls nothing).

use std::path::PathBuf;

use crate::catalogue::{Catalogue, CheckReport, CheckedPlugin, DirError, PluginList};
use crate::runtime::{Runtime, RuntimeConfig};

/// Why a plugins command could not run at all (problems *in* plugins are
/// in the report instead).
#[derive(Debug, thiserror::Error)]
pub enum PluginsError {
    #[error("{0}")]
    Dir(#[from] DirError),
    #[error("`{name}` is not a plugin name: use 1–63 of a-z, 0-9 and -, starting with a letter")]
    BadName { name: String },
    #[error(
        "`{name}` would name the plugin's crate `crewlet-plugin-{name}`, the guest SDK's own; choose another name"
    )]
    SdkName { name: String },
    #[error("{} already exists; choose another name or directory", path.display())]
    Exists { path: PathBuf },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the plugin engine could not start: {0}")]
    Engine(String),
}

/// Validates every plugin under `dirs` without running any.
pub fn check(dirs: &[PathBuf]) -> Result<CheckReport, PluginsError> {
    let (catalogue, invalid) = Catalogue::load_dirs(dirs)?;
    let runtime = Runtime::new(RuntimeConfig {
        data_dir: None,
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .map_err(|e| PluginsError::Engine(e.to_string()))?;
    let mut plugins: Vec<CheckedPlugin> = invalid
        .into_iter()
        .map(|e| CheckedPlugin {
            file: e.file.clone(),
            name: None,
            problems: vec![e.to_string()],
        })
        .collect();
    for manifest in &catalogue.plugins {
        let problems = match runtime.load_component(manifest) {
            Ok(_) => Vec::new(),
            Err(e) => vec![e.to_string()],
        };
        plugins.push(CheckedPlugin {
            file: manifest.file.clone(),
            name: Some(manifest.name.clone()),
            problems,
        });
    }
    plugins.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(CheckReport {
        dirs: dirs.to_vec(),
        plugins,
        catalogue: catalogue.problems().iter().map(|p| p.to_string()).collect(),
    })
}

/// Every plugin under `dirs` with its effective permissions.
pub fn list(dirs: &[PathBuf]) -> Result<PluginList, PluginsError> {
    let (catalogue, invalid) = Catalogue::load_dirs(dirs)?;
    Ok(PluginList {
        dirs: dirs.to_vec(),
        catalogue,
        invalid,
    })
}
