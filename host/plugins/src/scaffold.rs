//! `crewlet plugins new --kind KIND NAME [--dir DIR]`: a plugin crate that
//! builds for `wasm32-wasip2` and passes its own test.
//!
//! The crate is standalone (its own `[workspace]`, the WIT copied into
//! `wit/`) so it builds wherever it is created, with only `wit-bindgen` as a
//! dependency (and `serde_json` for a module, whose tools take JSON). Its logic sits in plain functions with native unit tests
//! (`cargo test`), and `crewlet plugins check DIR` validates its manifest and
//! world once built.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::cli::PluginsError;
use crate::manifest::{Kind, valid_name};

const WIT_FILES: &[(&str, &str)] = &[
    ("wit/plugin.wit", include_str!("../../../wit/plugin.wit")),
    (
        "wit/deps/cli/cli.wit",
        include_str!("../../../wit/deps/cli/cli.wit"),
    ),
    (
        "wit/deps/clocks/clocks.wit",
        include_str!("../../../wit/deps/clocks/clocks.wit"),
    ),
    (
        "wit/deps/filesystem/filesystem.wit",
        include_str!("../../../wit/deps/filesystem/filesystem.wit"),
    ),
    (
        "wit/deps/http/http.wit",
        include_str!("../../../wit/deps/http/http.wit"),
    ),
    (
        "wit/deps/io/io.wit",
        include_str!("../../../wit/deps/io/io.wit"),
    ),
    (
        "wit/deps/random/random.wit",
        include_str!("../../../wit/deps/random/random.wit"),
    ),
    (
        "wit/deps/sockets/sockets.wit",
        include_str!("../../../wit/deps/sockets/sockets.wit"),
    ),
];

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
        for file in &self.files {
            writeln!(f, "  {}", file.display())?;
        }
        writeln!(f, "test:  cargo test --manifest-path {dir}/Cargo.toml")?;
        writeln!(
            f,
            "build: cargo build --release --target wasm32-wasip2 --manifest-path {dir}/Cargo.toml"
        )?;
        writeln!(f, "check: crewlet plugins check {dir}")
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
    let artifact = krate.replace('-', "_");
    let fill = |t: &str| {
        t.replace("{{name}}", name)
            .replace("{{crate}}", &krate)
            .replace("{{artifact}}", &artifact)
            .replace("{{secret}}", &name.replace('-', "_"))
            .replace("{{tool_prefix}}", &name.replace('-', "_"))
            .replace(
                "{{extra_dependencies}}",
                if kind == Kind::Module {
                    "serde_json = \"1\"\n"
                } else {
                    ""
                },
            )
    };
    let (lib, manifest_tail) = match kind {
        Kind::Webhook => (WEBHOOK_LIB, WEBHOOK_MANIFEST),
        Kind::Provider => (PROVIDER_LIB, PROVIDER_MANIFEST),
        Kind::Module => (MODULE_LIB, MODULE_MANIFEST),
    };
    let mut files: Vec<(String, String)> = vec![
        ("Cargo.toml".to_string(), fill(CARGO_TOML)),
        (
            "plugin.toml".to_string(),
            fill(&format!("{MANIFEST_HEAD}{manifest_tail}")).replace("{{kind}}", kind.world()),
        ),
        ("src/lib.rs".to_string(), fill(lib)),
        (".gitignore".to_string(), "/target\n".to_string()),
    ];
    for (path, text) in WIT_FILES {
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

const CARGO_TOML: &str = r#"[package]
name = "{{crate}}"
version = "0.1.0"
edition = "2024"
publish = false

# A cdylib built with `--target wasm32-wasip2` is a component. `cargo test`
# runs the unit tests natively (it builds the test harness, not the cdylib).
[lib]
crate-type = ["cdylib"]

[dependencies]
wit-bindgen = "0.61"
{{extra_dependencies}}
[workspace]
"#;

const MANIFEST_HEAD: &str = r#"name = "{{name}}"
version = "0.1.0"
kind = "{{kind}}"
component = "target/wasm32-wasip2/release/{{artifact}}.wasm"

[limits]
memory_mib = 32
"#;

const WEBHOOK_MANIFEST: &str = r#"deadline_ms = 500

[webhook]
routes = ["/webhooks/{{name}}"]
secrets = ["{{secret}}_token"]
"#;

const PROVIDER_MANIFEST: &str = r#"deadline_ms = 120000

[provider]
base_url = "https://api.example.com/v1"
allowed_outbound_hosts = ["https://api.example.com:443"]
"#;

const MODULE_MANIFEST: &str = r#"deadline_ms = 2000

[module]
# Local topic names; published as `module.{{name}}.<topic>`.
publishes = ["noted"]

# A company event kind (or another module's topic: `topic = "MODULE.TOPIC"`).
[[module.subscribe]]
event = "turn_ended"
delivery = "once"

[module.state.notes]
history = 1

# A tool seats may call (as `{{tool_prefix}}__add_note`); the host checks
# every call's arguments against this JSON Schema before the module runs.
[module.tools.add-note]
description = "Keeps a note under a key, in the bucket `notes`"
arguments = { type = "object", properties = { key = { type = "string" }, text = { type = "string" } }, required = ["key", "text"] }
"#;

const WEBHOOK_LIB: &str = r#"//! The `{{name}}` webhook plugin: a shared token in `x-{{name}}-token`,
//! compared in constant time with the secret `{{secret}}_token`; the body,
//! as text, becomes one delivery. Set `owed` to where a person waits for an
//! answer (a channel, a thread) when the delivery asks a question; it is
//! `None` here: a bare message asks for nothing.

wit_bindgen::generate!({ world: "webhook", path: "wit" });

use crewlet::plugin::log::{self, Level};
use exports::crewlet::plugin::inbound::{
    Addressed, Delivery, Guest, ParseError, Parsed, Request, VerifyError,
};

/// Equal length and content, in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks the token header against the secret.
pub fn check_token(header: Option<&str>, secret: Option<&[u8]>) -> Result<(), VerifyError> {
    let secret = secret.ok_or_else(|| VerifyError::MissingSecret("{{secret}}_token".into()))?;
    let header = header.ok_or_else(|| VerifyError::MissingHeader("x-{{name}}-token".into()))?;
    if constant_time_eq(header.as_bytes(), secret) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        let header = req.headers.iter().find(|h| h.name == "x-{{name}}-token").map(|h| h.value.as_str());
        let secret = req.secrets.iter().find(|s| s.name == "{{secret}}_token").map(|s| s.value.as_slice());
        check_token(header, secret)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        let text = String::from_utf8(req.body.clone())
            .map_err(|_| ParseError::MalformedBody("the body is not UTF-8".into()))?;
        let id = req.headers.iter().find(|h| h.name == "x-request-id").map(|h| h.value.clone());
        log::write(Level::Debug, &format!("{} bytes of text", text.len()));
        Ok(Parsed {
            deliveries: vec![Delivery {
                source: "{{name}}".into(),
                event_type: "message".into(),
                delivery_id: id.ok_or_else(|| ParseError::MissingField("header x-request-id".into()))?,
                addressed: Addressed { mentions: vec![], assignees: vec![], reviewers: vec![], channel: None, thread: None },
                text: Some(text),
                payload: req.body,
                owed: None,
            }],
            reply: None,
        })
    }
}

export!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_must_match() {
        assert!(check_token(Some("s3cret"), Some(b"s3cret")).is_ok());
        assert!(matches!(check_token(Some("s3creT"), Some(b"s3cret")), Err(VerifyError::Mismatch)));
        assert!(matches!(check_token(None, Some(b"s3cret")), Err(VerifyError::MissingHeader(_))));
        assert!(matches!(check_token(Some("x"), None), Err(VerifyError::MissingSecret(_))));
    }
}
"#;

const PROVIDER_LIB: &str = r#"//! The `{{name}}` provider plugin. Translate `Request` to your vendor's wire
//! format, send it with `wasi:http/outgoing-handler` (the only import this
//! world has; the host checks every request against allowed_outbound_hosts),
//! and classify failures. Until then every call answers a bad-request error
//! that says so.

wit_bindgen::generate!({ world: "provider", path: "wit", generate_all });

use exports::crewlet::plugin::completions::{Completion, ErrorKind, Guest, ProviderError, Request};

/// The vendor endpoint for a base URL.
pub fn endpoint(base_url: &str) -> String {
    format!("{}/chat/completions", base_url.trim_end_matches('/'))
}

struct Plugin;

impl Guest for Plugin {
    fn complete(req: Request) -> Result<Completion, ProviderError> {
        Err(ProviderError {
            kind: ErrorKind::BadRequest,
            status: None,
            request_id: None,
            message: format!("{{name}} does not speak to {} yet: implement complete()", endpoint(&req.base_url)),
        })
    }
}

export!(Plugin);

#[cfg(test)]
mod tests {
    #[test]
    fn endpoint_joins_without_double_slash() {
        assert_eq!(super::endpoint("https://api.example.com/v1/"), "https://api.example.com/v1/chat/completions");
    }
}
"#;

const MODULE_LIB: &str = r##"//! The `{{name}}` module: owns the bucket `notes`. Its tool `add-note`
//! keeps a note under a key and publishes `noted`; every `turn_ended` event
//! adds one to the count under `turns-ended`.

wit_bindgen::generate!({ world: "module", path: "wit" });

use crewlet::plugin::{bus, log, state};
use exports::crewlet::plugin::handlers::{Event, Guest, StateEvent, ToolCall};

/// The key and text of an `add-note` call (the host has already checked
/// them against the manifest's schema).
pub fn note(arguments_json: &str) -> Result<(String, String), String> {
    let v: serde_json::Value = serde_json::from_str(arguments_json).map_err(|e| e.to_string())?;
    let key = v["key"].as_str().ok_or("`key` must be a string")?;
    let text = v["text"].as_str().ok_or("`text` must be a string")?;
    Ok((key.to_string(), text.to_string()))
}

/// The count after one more, from the stored text (absent or unreadable: 0).
pub fn next_count(stored: Option<&[u8]>) -> u64 {
    stored
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|t| t.parse::<u64>().ok())
        .unwrap_or(0)
        + 1
}

struct Module;

impl Guest for Module {
    fn init() -> Result<(), String> {
        log::write(log::Level::Info, "{{name}} ready");
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        match event.topic.as_str() {
            "turn_ended" => {
                let stored = state::get("notes", "turns-ended").map_err(|e| format!("{e:?}"))?;
                let count = next_count(stored.as_ref().map(|e| e.value.as_slice()));
                state::put("notes", "turns-ended", count.to_string().as_bytes())
                    .map_err(|e| format!("{e:?}"))?;
                Ok(())
            }
            other => Err(format!("{{name}} does not handle `{other}`")),
        }
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Ok(())
    }

    fn call_tool(call: ToolCall) -> Result<String, String> {
        match call.name.as_str() {
            "add-note" => {
                let (key, text) = note(&call.arguments_json)?;
                let revision = state::put("notes", &key, text.as_bytes()).map_err(|e| format!("{e:?}"))?;
                let event = serde_json::json!({ "key": key, "by": call.caller.seat });
                bus::publish("noted", event.to_string().as_bytes()).map_err(|e| format!("{e:?}"))?;
                Ok(format!("noted `{key}` (revision {revision})"))
            }
            other => Err(format!("{{name}} has no tool `{other}`")),
        }
    }
}

export!(Module);

#[cfg(test)]
mod tests {
    #[test]
    fn a_note_needs_a_key_and_a_text() {
        assert_eq!(
            super::note(r#"{"key":"a","text":"b"}"#),
            Ok(("a".to_string(), "b".to_string()))
        );
        assert!(super::note(r#"{"key":"a"}"#).is_err());
        assert!(super::note("not json").is_err());
    }

    #[test]
    fn counts_start_at_one() {
        assert_eq!(super::next_count(None), 1);
        assert_eq!(super::next_count(Some(b"41")), 42);
        assert_eq!(super::next_count(Some(b"junk")), 1);
    }
}
"##;
