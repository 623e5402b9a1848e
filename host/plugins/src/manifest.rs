//! `plugin.toml`: what a plugin is and everything it may touch.
//!
//! Rules, and why:
//! - Unknown fields are refused, so a misspelt permission is an error rather
//!   than a permission silently not granted.
//! - Every error names the file and the field (`limits.memory_mib`), so the
//!   author knows which line to fix.
//! - A kind's section is required for that kind and refused for the others:
//!   a webhook cannot carry `allowed_outbound_hosts` it would never use.
//! - Names are `a-z 0-9 -`: bucket names are built as `mod_<module>_<local>`
//!   and reads as `<module>.<bucket>`, so `_` and `.` must not appear in
//!   either part.
//! - A provider's `base_url` must be inside its own `allowed_outbound_hosts`;
//!   a manifest that could never make its first call is refused at check.
//! - The `[module]` section (buckets, topics, subscriptions, tools) has its
//!   own rules, in `manifest/module.rs`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod granted;
mod module;

pub use granted::{ByOperator, Granted, NotHeld, Permission};
pub(crate) use module::compile as compile_schema;
pub(crate) use module::read_of;
pub use module::{
    Delivery, MAX_TOOL_DESCRIPTION, MAX_TOOL_NAME, Source, Subscription, ToolDecl, valid_tool_name,
};

/// The manifest's file name, next to the component.
pub const MANIFEST_FILE: &str = "plugin.toml";

/// Memory cap when `limits.memory_mib` is absent.
pub const DEFAULT_MEMORY_MIB: u64 = 64;
/// The largest memory cap any manifest may ask for (the pool's slot size).
pub const MAX_MEMORY_MIB: u64 = 1024;
/// Per-call deadline when `limits.deadline_ms` is absent (webhook, module).
pub const DEFAULT_DEADLINE_MS: u64 = 1_000;
/// Per-call deadline when a provider's `limits.deadline_ms` is absent.
pub const DEFAULT_PROVIDER_DEADLINE_MS: u64 = 120_000;
/// The longest deadline any manifest may ask for.
pub const MAX_DEADLINE_MS: u64 = 600_000;
/// Calls of one plugin at once when `limits.concurrency` is absent.
pub const DEFAULT_CONCURRENCY: u32 = 4;
/// The most calls of one plugin that run at once, whatever its manifest says.
pub const MAX_CONCURRENCY: u32 = 16;

/// What the host lets one world's manifest ask for: the host's policy,
/// whatever a plugin's author would like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceiling {
    pub deadline_ms: u64,
    pub memory_mib: u64,
    /// The most bytes the host copies out of the guest in one call: what
    /// an export returns, or what the guest passes to one host function.
    /// Wasmtime's hostcall fuel, so every string and list is weighed
    /// before it is copied — an answer whose strings all point at the same
    /// guest buffer cannot multiply into host memory.
    pub transfer_mib: u64,
    /// Why the deadline is bounded, for the error that names the field.
    pub why: &'static str,
}

impl Ceiling {
    /// [`Ceiling::transfer_mib`] in bytes.
    pub fn transfer_bytes(&self) -> usize {
        (self.transfer_mib as usize) << 20
    }
}

impl Kind {
    /// The host's ceiling for this world.
    pub fn ceiling(self) -> Ceiling {
        match self {
            // A sender waits for the answer: Slack gives up after 3 s,
            // GitHub after 10 s; verify and parse are pure computation.
            Kind::Webhook => Ceiling {
                deadline_ms: 5_000,
                memory_mib: 128,
                // The most a well-formed answer holds: 100 deliveries of
                // 512 KiB (`webhook::MAX_DELIVERIES`, `MAX_DELIVERY_BYTES`).
                transfer_mib: 64,
                why: "a sender waits for the answer (Slack gives up after 3 s, GitHub after 10 s)",
            },
            // A model call waits on a vendor.
            Kind::Provider => Ceiling {
                deadline_ms: MAX_DEADLINE_MS,
                memory_mib: 256,
                transfer_mib: 64,
                why: "a model call may wait on its vendor, but not for ever",
            },
            // A module step (init, an event, a state change) holds its
            // module's one instance; init runs before the module serves.
            Kind::Module => Ceiling {
                deadline_ms: 30_000,
                memory_mib: 256,
                transfer_mib: 16,
                why: "a module step holds the module's one instance",
            },
        }
    }
}
/// The most past values a bucket may keep per key (NATS's own limit).
pub const MAX_HISTORY: u8 = 64;

/// A manifest problem, naming the file and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: field `{field}`: {problem}", file.display())]
pub struct ManifestError {
    pub file: PathBuf,
    pub field: String,
    pub problem: String,
}

/// The three plugin kinds, one per world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Webhook,
    Provider,
    Module,
}

impl Kind {
    /// The WIT world a component of this kind must target.
    pub fn world(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::Provider => "provider",
            Kind::Module => "module",
        }
    }

    /// Parses `webhook`, `provider` or `module`.
    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "webhook" => Some(Kind::Webhook),
            "provider" => Some(Kind::Provider),
            "module" => Some(Kind::Module),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.world())
    }
}

/// Per-instance limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most linear memory one instance may have.
    pub memory_bytes: u64,
    /// The most one call may take, host calls included.
    pub deadline: std::time::Duration,
    /// The most calls that run at once (capped by
    /// [`MAX_CONCURRENCY`]).
    pub concurrency: u32,
    /// The largest body a webhook route reads: [`DEFAULT_MAX_BODY`]
    /// unless the operator granted more (never the manifest).
    pub max_body_bytes: u64,
}

/// The body a webhook route reads when no grant says otherwise: 1 MiB.
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;
/// The most an operator may grant a webhook route: 25 MiB, GitHub's own
/// cap on a delivery.
pub const MAX_GRANTED_BODY: u64 = 25 * 1024 * 1024;

/// One `scheme://host:port` a provider may reach.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

/// Why a text is no [`Origin`]. Whoever wrote the text is to blame (a
/// manifest's author, an operator's grant): write it as
/// `http(s)://host[:port]`, one host, no wildcard, no user info.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOrigin {
    #[error("`{0}` is not scheme://host:port")]
    NotAnOrigin(String),
    #[error("`{0}`: the scheme must be http or https")]
    Scheme(String),
    #[error("`{0}`: user info is not allowed")]
    UserInfo(String),
    #[error("`{0}`: the port must be a number")]
    Port(String),
    #[error("`{0}`: a host is required and wildcards are not allowed")]
    Host(String),
}

impl Origin {
    /// Parses `http(s)://host[:port][/…]`; the path is ignored, a missing
    /// port is the scheme's default. Host names compare lower-case.
    pub fn parse(text: &str) -> Result<Origin, BadOrigin> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| BadOrigin::NotAnOrigin(text.to_owned()))?;
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            _ => return Err(BadOrigin::Scheme(text.to_owned())),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') {
            return Err(BadOrigin::UserInfo(text.to_owned()));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
                let port = p
                    .parse::<u16>()
                    .map_err(|_| BadOrigin::Port(text.to_owned()))?;
                (h, port)
            }
            _ => (authority, default_port),
        };
        if host.is_empty() || host.contains('*') {
            return Err(BadOrigin::Host(text.to_owned()));
        }
        Ok(Origin {
            scheme: scheme.to_string(),
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// A bucket the module owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketDecl {
    /// The name the module uses.
    pub local: String,
    /// Values kept per key.
    pub history: u8,
    /// How long a value lives; `None` for ever.
    pub ttl: Option<std::time::Duration>,
}

/// A bucket of another module, read-only.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadDecl {
    pub module: String,
    pub bucket: String,
}

impl fmt::Display for ReadDecl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.module, self.bucket)
    }
}

/// What a kind's section declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permissions {
    Webhook {
        routes: Vec<String>,
        secrets: Vec<String>,
    },
    Provider {
        base_url: String,
        allowed_outbound_hosts: Vec<Origin>,
        /// The keys of a model entry's `options` this provider reads; a
        /// company setting any other is refused (never silently ignored).
        options: Vec<String>,
    },
    Module {
        state: Vec<BucketDecl>,
        reads: Vec<ReadDecl>,
        /// Local topic names, published as `module.<name>.<topic>`.
        publishes: Vec<String>,
        subscribes: Vec<Subscription>,
        tools: Vec<ToolDecl>,
    },
}

/// A parsed, validated manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Where it was read from.
    pub file: PathBuf,
    pub name: String,
    pub version: String,
    pub kind: Kind,
    /// The component, resolved against the manifest's directory.
    pub component: PathBuf,
    /// Whether the plugin gets a private scratch directory.
    pub scratch: bool,
    pub limits: Limits,
    pub permissions: Permissions,
    /// What the operator's grant added and denied (empty: nothing); the
    /// `permissions` above are already the effective ones.
    pub granted: Granted,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    name: String,
    version: String,
    kind: String,
    component: String,
    #[serde(default)]
    scratch: bool,
    #[serde(default)]
    limits: RawLimits,
    webhook: Option<RawWebhook>,
    provider: Option<RawProvider>,
    module: Option<module::RawModule>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    memory_mib: Option<u64>,
    deadline_ms: Option<u64>,
    concurrency: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebhook {
    routes: Vec<String>,
    #[serde(default)]
    secrets: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    base_url: String,
    allowed_outbound_hosts: Vec<String>,
    #[serde(default)]
    options: Vec<String>,
}

/// Whether `name` is a provider option's name: `a-z 0-9 _`, starting with
/// a letter, at most 63 characters.
fn valid_option(name: &str) -> bool {
    lowercase_word(name, b'_')
}

/// Whether `name` is a plugin or bucket name: `a-z 0-9 -`, starting with a
/// letter, at most 63 characters.
pub fn valid_name(name: &str) -> bool {
    lowercase_word(name, b'-')
}

/// Whether `route` can be a webhook route: `/webhooks/…` of a-z A-Z 0-9
/// / - _; else why not.
pub(crate) fn check_route(route: &str) -> Result<(), String> {
    let ok = route.starts_with("/webhooks/")
        && route.len() > "/webhooks/".len()
        && route
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{route}` must start with /webhooks/ and use only a-z A-Z 0-9 / - _"
        ))
    }
}

/// `a-z`, `0-9` and `joiner`, starting with a letter, 1–63 bytes.
fn lowercase_word(name: &str, joiner: u8) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == joiner)
}

impl Manifest {
    /// Reads and validates `file`.
    pub fn load(file: &Path) -> Result<Manifest, ManifestError> {
        let text = std::fs::read_to_string(file).map_err(|e| ManifestError {
            file: file.to_path_buf(),
            field: "(file)".to_string(),
            problem: format!("cannot read it: {e}"),
        })?;
        Manifest::parse(file, &text)
    }

    /// Validates manifest `text` as if read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Manifest, ManifestError> {
        let err = |field: &str, problem: String| ManifestError {
            file: file.to_path_buf(),
            field: field.to_string(),
            problem,
        };
        let value: toml::Value = toml::from_str(text)
            .map_err(|e| err("(syntax)", format!("not valid TOML: {}", e.message())))?;
        let raw: Raw = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "(top level)".to_string()
            } else {
                path
            };
            err(&field, e.into_inner().to_string())
        })?;

        if !valid_name(&raw.name) {
            return Err(err(
                "name",
                format!(
                    "`{}` must be 1–63 of a-z, 0-9 and -, starting with a letter",
                    raw.name
                ),
            ));
        }
        let semver = raw.version.split('.').collect::<Vec<_>>();
        if semver.len() != 3 || semver.iter().any(|p| p.parse::<u64>().is_err()) {
            return Err(err(
                "version",
                format!("`{}` must be MAJOR.MINOR.PATCH", raw.version),
            ));
        }
        let kind = Kind::parse(&raw.kind).ok_or_else(|| {
            err(
                "kind",
                format!("`{}` must be webhook, provider or module", raw.kind),
            )
        })?;
        if raw.component.is_empty() || Path::new(&raw.component).is_absolute() {
            return Err(err(
                "component",
                "must be a path relative to the manifest's directory".to_string(),
            ));
        }
        let dir = file.parent().unwrap_or(Path::new("."));
        let component = dir.join(&raw.component);

        let ceiling = kind.ceiling();
        let memory_mib = raw.limits.memory_mib.unwrap_or(DEFAULT_MEMORY_MIB);
        if !(1..=MAX_MEMORY_MIB).contains(&memory_mib) {
            return Err(err(
                "limits.memory_mib",
                format!("{memory_mib} must be between 1 and {MAX_MEMORY_MIB}"),
            ));
        }
        if memory_mib > ceiling.memory_mib {
            return Err(err(
                "limits.memory_mib",
                format!(
                    "{memory_mib} is above the host's ceiling for a {kind} plugin ({} MiB); ask for less",
                    ceiling.memory_mib
                ),
            ));
        }
        let default_deadline = if kind == Kind::Provider {
            DEFAULT_PROVIDER_DEADLINE_MS
        } else {
            DEFAULT_DEADLINE_MS
        };
        let deadline_ms = raw.limits.deadline_ms.unwrap_or(default_deadline);
        if !(1..=MAX_DEADLINE_MS).contains(&deadline_ms) {
            return Err(err(
                "limits.deadline_ms",
                format!("{deadline_ms} must be between 1 and {MAX_DEADLINE_MS}"),
            ));
        }
        if deadline_ms > ceiling.deadline_ms {
            return Err(err(
                "limits.deadline_ms",
                format!(
                    "{deadline_ms} is above the host's ceiling for a {kind} plugin ({} ms: {}); ask for less",
                    ceiling.deadline_ms, ceiling.why
                ),
            ));
        }
        let concurrency = raw.limits.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        let max_concurrency = MAX_CONCURRENCY;
        if !(1..=max_concurrency).contains(&concurrency) {
            return Err(err(
                "limits.concurrency",
                format!(
                    "{concurrency} must be between 1 and {max_concurrency} (the host's ceiling)"
                ),
            ));
        }
        let limits = Limits {
            memory_bytes: memory_mib * 1024 * 1024,
            deadline: std::time::Duration::from_millis(deadline_ms),
            concurrency,
            max_body_bytes: DEFAULT_MAX_BODY,
        };

        let sections = [
            ("webhook", raw.webhook.is_some(), Kind::Webhook),
            ("provider", raw.provider.is_some(), Kind::Provider),
            ("module", raw.module.is_some(), Kind::Module),
        ];
        for (section, present, owner) in sections {
            if present && owner != kind {
                return Err(err(
                    section,
                    format!("a {kind} plugin has no [{section}] section; remove it"),
                ));
            }
        }

        let permissions = match kind {
            Kind::Webhook => {
                let section = raw.webhook.ok_or_else(|| {
                    err(
                        "webhook",
                        "a webhook plugin needs [webhook] with `routes`".to_string(),
                    )
                })?;
                if section.routes.is_empty() {
                    return Err(err("webhook.routes", "name at least one route".to_string()));
                }
                for (i, route) in section.routes.iter().enumerate() {
                    check_route(route).map_err(|p| err(&format!("webhook.routes[{i}]"), p))?;
                }
                for (i, secret) in section.secrets.iter().enumerate() {
                    let ok = !secret.is_empty()
                        && secret
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                    if !ok {
                        return Err(err(
                            &format!("webhook.secrets[{i}]"),
                            format!("`{secret}` must be a-z, 0-9 and _"),
                        ));
                    }
                }
                Permissions::Webhook {
                    routes: section.routes,
                    secrets: section.secrets,
                }
            }
            Kind::Provider => {
                let section = raw.provider.ok_or_else(|| {
                    err(
                        "provider",
                        "a provider plugin needs [provider] with `base_url` and `allowed_outbound_hosts`"
                            .to_string(),
                    )
                })?;
                let mut hosts = Vec::new();
                for (i, host) in section.allowed_outbound_hosts.iter().enumerate() {
                    hosts.push(Origin::parse(host).map_err(|p| {
                        err(
                            &format!("provider.allowed_outbound_hosts[{i}]"),
                            p.to_string(),
                        )
                    })?);
                }
                let base = Origin::parse(&section.base_url)
                    .map_err(|p| err("provider.base_url", p.to_string()))?;
                if !hosts.contains(&base) {
                    return Err(err(
                        "provider.base_url",
                        format!(
                            "its origin {base} is not in allowed_outbound_hosts; add \"{base}\" there"
                        ),
                    ));
                }
                if let Some(bad) = section.options.iter().find(|o| !valid_option(o)) {
                    return Err(err(
                        "provider.options",
                        format!(
                            "`{bad}` is not an option name; use a-z, 0-9 and _, starting with a letter"
                        ),
                    ));
                }
                Permissions::Provider {
                    base_url: section.base_url,
                    allowed_outbound_hosts: hosts,
                    options: section.options,
                }
            }
            Kind::Module => module::parse(&raw.name, raw.module.unwrap_or_default())
                .map_err(|(field, problem)| err(&field, problem))?,
        };

        Ok(Manifest {
            file: file.to_path_buf(),
            name: raw.name,
            version: raw.version,
            kind,
            component,
            scratch: raw.scratch,
            limits,
            permissions,
            granted: Granted::default(),
        })
    }
}

/// The mesh-wide bucket name of `module`'s bucket `local`:
/// `mod_<module>_<local>`, `-` kept (NATS allows it), unambiguous because
/// neither part may contain `_`.
pub fn bucket_name(module: &str, local: &str) -> String {
    format!("mod_{module}_{local}")
}

#[cfg(test)]
mod tests;
