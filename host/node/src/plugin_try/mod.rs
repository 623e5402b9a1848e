//! `crewlet plugins try NAME --request FILE`: one request run through one
//! plugin, outside a node, printed with what the plugin wrote — the
//! author's loop, and the way a refused delivery is replayed without its
//! sender. Each kind reads a request of its own shape ([`webhook`],
//! [`provider`], [`module`]). Exit 0 when the plugin answered (a webhook
//! delivery would be accepted), 1 when it refused or faulted, 2 when the
//! request or the plugin is wrong.

mod module;
mod provider;
mod webhook;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crewlet_plugins::{Catalogue, Kind, Manifest, Runtime, RuntimeConfig};
use serde_json::Value;

/// Runs the trial and prints it; answers the exit status.
pub fn try_plugin(name: &str, request: &Path, dirs: &[PathBuf], json: bool) -> i32 {
    let bytes = match std::fs::read(request) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("crewlet: {}: {e}", request.display());
            return 2;
        }
    };
    let catalogue = match Catalogue::load_dirs(dirs) {
        Ok((catalogue, _)) => catalogue,
        Err(e) => {
            eprintln!("crewlet: {e}");
            return 2;
        }
    };
    let Some(manifest) = catalogue.plugins.iter().find(|m| m.name == name).cloned() else {
        eprintln!(
            "crewlet: no plugin named {name:?} in {dirs:?}; `crewlet plugins list` names them"
        );
        return 2;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crewlet: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let request = Trial {
        file: request,
        bytes: &bytes,
        json,
    };
    runtime.block_on(async {
        let engine = match Runtime::new(RuntimeConfig {
            data_dir: None,
            max_instances: 4,
            ..RuntimeConfig::default()
        }) {
            Ok(engine) => engine,
            Err(e) => {
                eprintln!("crewlet: {e}");
                return 1;
            }
        };
        match manifest.kind {
            Kind::Webhook => webhook::run(&engine, manifest, &request).await,
            Kind::Provider => provider::run(&engine, manifest, &request).await,
            Kind::Module => module::run(&engine, manifest, &catalogue, &request).await,
        }
    })
}

/// The request file and how to print.
struct Trial<'a> {
    file: &'a Path,
    bytes: &'a [u8],
    json: bool,
}

impl Trial<'_> {
    /// The file as `T`; `Err` is the exit status after saying what shape
    /// was expected.
    fn read<T: serde::de::DeserializeOwned>(&self, expected: &str) -> Result<T, i32> {
        serde_json::from_slice(self.bytes).map_err(|e| {
            eprintln!("crewlet: {}: {e}; expected {expected}", self.file.display());
            2
        })
    }

    /// Prints `view` (as JSON, or as `render` makes it) and answers
    /// `status`.
    fn print(&self, view: &Value, render: fn(&Value) -> String, status: i32) -> i32 {
        if self.json {
            println!("{view:#}");
        } else {
            print!("{}", render(view));
        }
        status
    }
}

/// A load or a fault of the plugin: said, exit 1.
fn failed(manifest: &Manifest, e: impl std::fmt::Display) -> i32 {
    eprintln!("crewlet: {}: {e}", manifest.name);
    1
}

/// `Runtime::new`'s engine, shared by the kinds.
type Engine = Arc<Runtime>;

/// What the plugin wrote to stderr (`plugin_said`) and through `log`
/// (`plugin_logged`), one line each, for the text rendering.
fn spoken(v: &Value) -> String {
    let mut out = String::new();
    let said = v["plugin_said"].as_str().unwrap_or("");
    if !said.is_empty() {
        out.push_str(&format!("plugin said: {said}\n"));
    }
    for line in v["plugin_logged"].as_array().into_iter().flatten() {
        out.push_str(&format!("plugin logged: {}\n", line.as_str().unwrap_or("")));
    }
    out
}
