//! The document as written, and its validation into a [`Company`].

mod identities;
mod memory;
mod placement;
mod schedules;
mod surface;

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::identities::{Claimant, Registry};
use crate::{
    Ceilings, Company, DocError, Handle, Integration, Invalid, McpServer, McpTransport, ModelRef,
    Role, Seat, SecretRef, seat_id,
};
use identities::{RawIds, RawPerson};

/// Default bound on executor ↔ reviewer iterations.
const DEFAULT_MAX_ITERATIONS: u32 = 3;
/// Default bound on model ↔ tool rounds within one iteration.
const DEFAULT_MAX_TOOL_ROUNDS: u32 = 12;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Document {
    org: Org,
    #[serde(default)]
    roles: BTreeMap<String, RawRole>,
    #[serde(default)]
    seats: BTreeMap<String, RawSeat>,
    #[serde(default)]
    people: BTreeMap<String, RawPerson>,
    #[serde(default)]
    integrations: BTreeMap<String, RawIntegration>,
    #[serde(default)]
    schedules: BTreeMap<String, schedules::RawSchedule>,
    #[serde(default)]
    placement: placement::RawPlacement,
    #[serde(default)]
    budgets: RawBudgets,
    #[serde(default)]
    memory: memory::RawMemory,
}

/// `[budgets]`: how the company's budgets behave (the ceilings are under
/// `[org]` and each role).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudgets {
    #[serde(default)]
    announce_park: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Org {
    name: String,
    #[serde(default = "utc")]
    timezone: String,
    #[serde(default)]
    budget: RawCeilings,
}

fn utc() -> String {
    "UTC".into()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCeilings {
    day: Option<i64>,
    week: Option<i64>,
    month: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRole {
    system_prompt: String,
    executor: Vec<RawModel>,
    reviewer: RawModel,
    #[serde(default)]
    mcp: BTreeMap<String, RawMcp>,
    #[serde(default)]
    modules: Vec<String>,
    max_iterations: Option<i64>,
    max_tool_rounds: Option<i64>,
    #[serde(default)]
    budget: RawCeilings,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    provider: String,
    model: String,
    credentials: Option<OneOrMany>,
    #[serde(default)]
    options: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcp {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    replies: Vec<String>,
    read_thread: Option<surface::RawSurfaceTool>,
    raise_working: Option<surface::RawSurfaceTool>,
    clear_working: Option<surface::RawSurfaceTool>,
    notice: Option<surface::RawSurfaceTool>,
    #[serde(default)]
    sources: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSeat {
    role: String,
    group: Option<String>,
    #[serde(default)]
    credentials: BTreeMap<String, String>,
    #[serde(default)]
    identities: BTreeMap<String, RawIds>,
    #[serde(default)]
    signing_secrets: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIntegration {
    plugin: String,
    secret: String,
}

/// A seat's `signing_secrets` (source → the secret its own app signs
/// with): each source one the document integrates, each secret named as an
/// integration's is (`${NAME}` or `NAME`).
fn signing_secrets(
    path: &str,
    raw: BTreeMap<String, String>,
    integrations: &BTreeMap<String, RawIntegration>,
    errors: &mut Errors,
) -> BTreeMap<String, SecretRef> {
    let mut out = BTreeMap::new();
    for (source, secret) in raw {
        let at = format!("{path}.signing_secrets.{source}");
        if !integrations.contains_key(&source) {
            let known: Vec<&str> = integrations.keys().map(String::as_str).collect();
            errors.add(
                at,
                format!(
                    "no `[integrations.{source}]` in this document: a seat's signing secret verifies its route of an integrated source (integrated: {})",
                    if known.is_empty() { "none".into() } else { known.join(", ") }
                ),
            );
            continue;
        }
        let name = secret.trim_start_matches("${").trim_end_matches('}');
        if let Some(secret) = errors.check(at, SecretRef::name(name)) {
            out.insert(source, secret);
        }
    }
    out
}

/// Collects errors with their paths.
#[derive(Default)]
pub(crate) struct Errors(Vec<DocError>);

impl Errors {
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(DocError {
            path: path.into(),
            message: message.into(),
        });
    }

    pub(crate) fn check<T, E: std::fmt::Display>(
        &mut self,
        path: impl Into<String>,
        r: Result<T, E>,
    ) -> Option<T> {
        r.map_err(|m| self.add(path, m.to_string())).ok()
    }
}

pub(crate) fn token(s: &str) -> Result<(), String> {
    if s.is_empty()
        || s.len() > 64
        || !s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!(
            "{s:?} is not a name: use letters, digits, `-` and `_` (1 to 64)"
        ));
    }
    Ok(())
}

pub(crate) fn non_empty(s: &str, what: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        Err(format!("expected {what}, found an empty string"))
    } else {
        Ok(())
    }
}

impl RawCeilings {
    fn validate(&self, path: &str, errors: &mut Errors) -> Ceilings {
        let mut one = |name: &str, v: Option<i64>| match v {
            None => None,
            Some(n) if n > 0 => Some(n as u64),
            Some(n) => {
                errors.add(
                    format!("{path}.{name}"),
                    format!(
                        "expected a positive token ceiling, found {n} (leave it out for no ceiling)"
                    ),
                );
                None
            }
        };
        Ceilings {
            day: one("day", self.day),
            week: one("week", self.week),
            month: one("month", self.month),
        }
    }
}

impl RawModel {
    fn validate(self, path: &str, errors: &mut Errors) -> ModelRef {
        errors.check(format!("{path}.provider"), token(&self.provider));
        errors.check(
            format!("{path}.model"),
            non_empty(&self.model, "a model name"),
        );
        let credentials: Vec<SecretRef> = match self.credentials {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => errors
                .check(format!("{path}.credentials"), SecretRef::parse(&s))
                .into_iter()
                .collect(),
            Some(OneOrMany::Many(list)) => {
                if list.is_empty() {
                    errors.add(
                        format!("{path}.credentials"),
                        "expected at least one credential reference, or leave the key out",
                    );
                }
                list.iter()
                    .enumerate()
                    .filter_map(|(i, s)| {
                        errors.check(format!("{path}.credentials[{i}]"), SecretRef::parse(s))
                    })
                    .collect()
            }
        };
        let options = self
            .options
            .into_iter()
            .map(|(k, v)| {
                let json = serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
                (k, json)
            })
            .collect();
        ModelRef {
            provider: self.provider,
            model: self.model,
            credentials,
            options,
        }
    }
}

impl RawMcp {
    fn validate(self, path: &str, errors: &mut Errors) -> Option<McpServer> {
        let transport = match (self.command, self.url) {
            (Some(command), None) => {
                if !self.headers.is_empty() {
                    errors.add(
                        format!("{path}.headers"),
                        "headers apply to `url` servers; a `command` server takes `env`",
                    );
                }
                errors.check(format!("{path}.command"), non_empty(&command, "a command"));
                if let Some(cwd) = &self.cwd
                    && !cwd.starts_with('/')
                {
                    errors.add(
                        format!("{path}.cwd"),
                        format!("expected an absolute directory, found {cwd:?}"),
                    );
                }
                McpTransport::Stdio {
                    command,
                    args: self.args,
                    env: self.env,
                    cwd: self.cwd,
                }
            }
            (None, Some(url)) => {
                if !self.args.is_empty() || !self.env.is_empty() || self.cwd.is_some() {
                    errors.add(path, "`args`, `env` and `cwd` apply to `command` servers; a `url` server takes `headers`");
                }
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    errors.add(
                        format!("{path}.url"),
                        format!("expected an http(s) URL, found {url:?}"),
                    );
                }
                McpTransport::Http {
                    url,
                    headers: self.headers,
                }
            }
            (Some(_), Some(_)) => {
                errors.add(
                    path,
                    "give either `command` (a stdio server) or `url` (an HTTP server), not both",
                );
                return None;
            }
            (None, None) => {
                errors.add(
                    path,
                    "expected `command` (a stdio server) or `url` (an HTTP server)",
                );
                return None;
            }
        };
        for (i, tool) in self.replies.iter().enumerate() {
            errors.check(
                format!("{path}.replies[{i}]"),
                non_empty(tool, "a tool name"),
            );
        }
        let surface = surface::validate(
            path,
            self.read_thread,
            self.raise_working,
            self.clear_working,
            self.notice,
            self.sources,
            errors,
        );
        Some(McpServer {
            transport,
            shared: self.shared,
            replies: self.replies,
            surface,
        })
    }
}

pub(crate) fn time_zone(name: &str) -> Result<jiff::tz::TimeZone, String> {
    jiff::tz::TimeZone::get(name).map_err(|_| {
        format!(
            "{name:?} is not an IANA time zone (e.g. \"Europe/Berlin\", \"America/New_York\", \"UTC\")"
        )
    })
}

pub(crate) fn bounded(
    path: String,
    v: Option<i64>,
    default: u32,
    max: u32,
    errors: &mut Errors,
) -> u32 {
    match v {
        None => default,
        Some(n) if n >= 1 && n <= max as i64 => n as u32,
        Some(n) => {
            errors.add(path, format!("expected 1 to {max}, found {n}"));
            default
        }
    }
}

impl Document {
    pub fn validate(self, digest: String) -> Result<Company, Invalid> {
        let mut errors = Errors::default();
        errors.check(
            "org.name",
            non_empty(&self.org.name, "the organisation's name"),
        );
        let org_tz = errors.check("org.timezone", time_zone(&self.org.timezone));
        let budget = self.org.budget.validate("org.budget", &mut errors);

        let mut roles = BTreeMap::new();
        for (name, r) in self.roles {
            let path = format!("roles.{name}");
            errors.check(path.clone(), token(&name));
            errors.check(
                format!("{path}.system_prompt"),
                non_empty(&r.system_prompt, "a system prompt"),
            );
            if r.executor.is_empty() {
                errors.add(
                    format!("{path}.executor"),
                    "expected at least one model in the executor chain",
                );
            }
            let executor = r
                .executor
                .into_iter()
                .enumerate()
                .map(|(i, m)| m.validate(&format!("{path}.executor[{i}]"), &mut errors))
                .collect();
            let reviewer = r
                .reviewer
                .validate(&format!("{path}.reviewer"), &mut errors);
            let mut mcp = BTreeMap::new();
            for (server, m) in r.mcp {
                let spath = format!("{path}.mcp.{server}");
                errors.check(spath.clone(), token(&server));
                if let Some(s) = m.validate(&spath, &mut errors) {
                    mcp.insert(server, s);
                }
            }
            let modules = role_modules(&path, r.modules, &mcp, &mut errors);
            let role = Role {
                name: name.clone(),
                system_prompt: r.system_prompt,
                executor,
                reviewer,
                mcp,
                modules,
                max_iterations: bounded(
                    format!("{path}.max_iterations"),
                    r.max_iterations,
                    DEFAULT_MAX_ITERATIONS,
                    20,
                    &mut errors,
                ),
                max_tool_rounds: bounded(
                    format!("{path}.max_tool_rounds"),
                    r.max_tool_rounds,
                    DEFAULT_MAX_TOOL_ROUNDS,
                    100,
                    &mut errors,
                ),
                budget: r.budget.validate(&format!("{path}.budget"), &mut errors),
            };
            roles.insert(name, role);
        }

        let mut seats = BTreeMap::new();
        let mut registry = Registry::default();
        for (handle, s) in self.seats {
            let path = format!("seats.{handle}");
            let Some(h) = errors.check(path.clone(), Handle::parse(&handle)) else {
                continue;
            };
            if !roles.contains_key(&s.role) {
                let known: Vec<&str> = roles.keys().map(String::as_str).collect();
                errors.add(
                    format!("{path}.role"),
                    format!(
                        "no role {:?} in `roles` (known: {})",
                        s.role,
                        if known.is_empty() {
                            "none".into()
                        } else {
                            known.join(", ")
                        }
                    ),
                );
            }
            if let Some(g) = &s.group {
                errors.check(format!("{path}.group"), token(g));
            }
            let mut credentials = BTreeMap::new();
            for (name, reference) in s.credentials {
                let cpath = format!("{path}.credentials.{name}");
                let name = errors.check(cpath.clone(), SecretRef::name(&name));
                let reference = errors.check(cpath, SecretRef::parse(&reference));
                if let (Some(name), Some(reference)) = (name, reference) {
                    credentials.insert(name.name_str().to_owned(), reference);
                }
            }
            let signing_secrets =
                signing_secrets(&path, s.signing_secrets, &self.integrations, &mut errors);
            let claimant = Claimant::Seat { handle: h.clone() };
            let identities =
                identities::validate(&path, s.identities, &claimant, &mut registry, &mut errors);
            identities::claim_chat_handle(&h, &claimant, &identities, &mut registry);
            let id = seat_id(&self.org.name, &h);
            seats.insert(
                h.clone(),
                Seat {
                    handle: h,
                    id,
                    role: s.role,
                    group: s.group,
                    credentials,
                    identities,
                    signing_secrets,
                },
            );
        }
        let people = identities::people(self.people, &mut registry, &mut errors);

        let mut integrations = BTreeMap::new();
        for (source, i) in self.integrations {
            let path = format!("integrations.{source}");
            errors.check(path.clone(), token(&source));
            errors.check(format!("{path}.plugin"), token(&i.plugin));
            let Some(secret) = errors.check(
                format!("{path}.secret"),
                SecretRef::name(i.secret.trim_start_matches("${").trim_end_matches('}')),
            ) else {
                continue;
            };
            integrations.insert(
                source.clone(),
                Integration {
                    source,
                    plugin: i.plugin,
                    secret,
                },
            );
        }

        let schedules = schedules::validate(
            self.schedules,
            (&self.org.timezone, org_tz.as_ref()),
            &roles,
            &seats,
            &mut errors,
        );

        let placement = placement::validate(self.placement, &mut errors);
        let embedding = memory::validate(self.memory, &mut errors);

        if errors.0.is_empty() {
            Ok(Company {
                org: self.org.name,
                timezone: self.org.timezone,
                budget,
                roles,
                seats,
                people,
                registry,
                integrations,
                schedules,
                placement,
                announce_park: self.budgets.announce_park,
                embedding,
                digest,
            })
        } else {
            Err(Invalid { errors: errors.0 })
        }
    }
}

/// A role's `modules`: plugin names (`a-z 0-9 -`, starting with a letter),
/// each once, none also the name of one of the role's MCP servers — both
/// are offered to the model as `NAME__TOOL`, so a shared name would make a
/// tool ambiguous.
fn role_modules(
    path: &str,
    names: Vec<String>,
    mcp: &BTreeMap<String, McpServer>,
    errors: &mut Errors,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let at = format!("{path}.modules[{i}]");
        let b = name.as_bytes();
        let valid = !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
        if !valid {
            errors.add(
                at,
                format!("{name:?} is not a module name (a-z 0-9 -, starting with a letter)"),
            );
        } else if out.contains(&name) {
            errors.add(at, format!("module {name:?} is listed twice"));
        } else if mcp.contains_key(&name) {
            errors.add(
                at,
                format!(
                    "module {name:?} has the name of one of this role's MCP servers; both offer tools as {name}__TOOL, so rename one"
                ),
            );
        } else {
            out.push(name);
        }
    }
    out
}
