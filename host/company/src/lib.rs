//! The company document: who works here, as what, with which tools and
//! budgets, and which surfaces reach them.
//!
//! A document is TOML. Parsing refuses unknown keys and wrong types (one
//! error, with its path); validation then reports *every* semantic error,
//! each with its path in the document (`roles.engineer.executor[1].model`),
//! because an operator fixing a document wants the whole list at once.
//!
//! Credentials never appear in a document: every credential field is a
//! `${NAME}` reference, resolved by the engine when a call needs it. A
//! literal key in a document is refused, since documents are stored,
//! versioned and shown.
//!
//! Seat ids are UUIDv5 over the org name and the handle, so every node
//! computes the same id with no database and no running instance.
//!
//! Schedules (`[schedules.NAME]`) are validated here, their cron
//! expressions and time zones included; when they fire is
//! `crewlet-schedule`'s.

mod identities;
mod raw;
pub mod resolve;
pub mod surface;

use std::collections::BTreeMap;
use std::fmt;

use crewlet_os::ConfigEpoch;
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use crewlet_schedule::{CatchUp, Cron, DEFAULT_CATCH_UP_LIMIT, MAX_CATCH_UP_LIMIT};
pub use identities::{Claimant, Identities, Person, Registry};

/// The largest prompt a schedule may carry, in bytes (8 KiB).
pub const MAX_PROMPT_BYTES: usize = 8 * 1024;

/// The namespace of seat ids (a fixed, random UUID).
pub const SEAT_NAMESPACE: uuid::Uuid = uuid::uuid!("8d6f3a52-1c4e-4b8e-9a57-2f0c6d9e4b13");

/// A handle or a secret name written against its rule: the writer (a
/// company document, a CLI argument, a record) is to blame, and the text
/// says the rule to follow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("a handle is 1 to 64 characters, found {0}")]
    HandleLength(usize),
    #[error(
        "{0:?} is not a handle: use lowercase letters, digits, `-` and `_`, starting with a letter or digit"
    )]
    NotAHandle(String),
    #[error(
        "expected a reference like `${{OPENAI_API_KEY}}`: credentials are never written into a document"
    )]
    NotAReference,
    #[error("{0:?} is not a secret name: use letters, digits and `_`, not starting with a digit")]
    NotASecretName(String),
}

/// A seat's handle: one subject token and one lease segment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Handle(String);

impl Handle {
    /// Lowercase letters, digits, `-` and `_`, starting with a letter or
    /// digit, at most 64: safe as a NATS subject token, a lease segment, a
    /// consumer name and a file name.
    pub fn parse(s: &str) -> Result<Handle, NameError> {
        let ok_char =
            |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
        if s.is_empty() || s.len() > 64 {
            return Err(NameError::HandleLength(s.len()));
        }
        if !s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            || !s.chars().all(ok_char)
        {
            return Err(NameError::NotAHandle(s.to_owned()));
        }
        Ok(Handle(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of the seat `handle` in `org`: the same on every node.
pub fn seat_id(org: &str, handle: &Handle) -> uuid::Uuid {
    // A handle holds no `/`, so splitting at the last one is unambiguous.
    uuid::Uuid::new_v5(&SEAT_NAMESPACE, format!("{org}/{handle}").as_bytes())
}

/// A `${NAME}` reference to a credential or secret, resolved at use.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct SecretRef(String);

impl SecretRef {
    /// Accepts exactly `${NAME}` with NAME of letters, digits and `_`.
    pub fn parse(s: &str) -> Result<SecretRef, NameError> {
        let name = s
            .strip_prefix("${")
            .and_then(|r| r.strip_suffix('}'))
            .ok_or(NameError::NotAReference)?;
        SecretRef::name(name)
    }

    /// Accepts a bare secret name (`GITHUB_WEBHOOK_SECRET`).
    pub fn name(name: &str) -> Result<SecretRef, NameError> {
        if name.is_empty()
            || name.len() > 128
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(NameError::NotASecretName(name.to_owned()));
        }
        Ok(SecretRef(name.to_owned()))
    }

    pub fn name_str(&self) -> &str {
        &self.0
    }
}

/// Token ceilings per calendar window; `None` is uncapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Ceilings {
    pub day: Option<u64>,
    pub week: Option<u64>,
    pub month: Option<u64>,
}

/// One model in a chain: which provider plugin, which model, which keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelRef {
    /// The provider plugin's name.
    pub provider: String,
    pub model: String,
    /// The key pool: one or more credential references.
    pub credentials: Vec<SecretRef>,
    /// Provider-specific settings (a base URL, a scripted provider's rules),
    /// passed to the plugin as they are.
    pub options: BTreeMap<String, serde_json::Value>,
}

/// An MCP server a role's seats use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct McpServer {
    pub transport: McpTransport,
    /// One child per node bound to the config epoch (`true`), or one child
    /// per seat carrying that seat's credentials (`false`, the default).
    pub shared: bool,
    /// The server's tools that post a reply where the trigger came from
    /// (`post_message`): the engine judges delivery by them and posts
    /// through them at most once per turn and target.
    pub replies: Vec<String>,
    /// The thread read-back and working indicator this server offers the
    /// turn (`read_thread`, `raise_working`, `clear_working`, `notice`, `sources`).
    pub surface: surface::SurfaceTools,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum McpTransport {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        /// The child's working directory (absolute); `None`: the node's.
        /// Which programs and directories a node runs is its own file's
        /// `[mcp]` allow-list, checked when a document is accepted and
        /// again at spawn.
        cwd: Option<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Role {
    pub name: String,
    pub system_prompt: String,
    pub executor: Vec<ModelRef>,
    pub reviewer: ModelRef,
    pub mcp: BTreeMap<String, McpServer>,
    /// Modules whose tools this role's seats may call, as `MODULE__TOOL`
    /// beside their MCP servers' tools.
    pub modules: Vec<String>,
    pub max_iterations: u32,
    pub max_tool_rounds: u32,
    pub budget: Ceilings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seat {
    pub handle: Handle,
    pub id: uuid::Uuid,
    pub role: String,
    /// Placement group; seats without one share the default group.
    pub group: Option<String>,
    /// This seat's own credentials: a `${NAME}` in a `shared = false` MCP
    /// server's template resolves here first (NAME → the secret holding
    /// this seat's value), then as a company secret.
    pub credentials: BTreeMap<String, SecretRef>,
    /// Who this seat is on each surface (`identities = { slack = "U…" }`):
    /// the ids a delivery addresses it by besides its handle.
    pub identities: Identities,
    /// The secret its own app signs with, per source
    /// (`signing_secrets = { slack = "${ADA_SLACK_SIGNING_SECRET}" }`): its
    /// route `/webhooks/SOURCE/HANDLE` verifies with it instead of the
    /// integration's, as a vendor that issues a secret per app (Slack)
    /// needs.
    pub signing_secrets: BTreeMap<String, SecretRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Integration {
    /// The source its webhook route serves (`/webhooks/SOURCE`).
    pub source: String,
    /// The webhook plugin that verifies and parses it.
    pub plugin: String,
    /// The secret that plugin verifies with, by name.
    pub secret: SecretRef,
}

/// A prompt sent on a clock: to one seat, or to every seat of a role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Schedule {
    /// Its key in `[schedules]`, a handle-like name.
    pub name: String,
    /// Read on the wall clock of `tz` (see `crewlet-schedule` for DST).
    pub cron: Cron,
    /// The IANA name of `tz`: the schedule's own `timezone`, or `org.timezone`.
    pub timezone: String,
    #[serde(skip)]
    pub tz: jiff::tz::TimeZone,
    /// What the document named.
    pub target: ScheduleTarget,
    /// The seats each fire wakes, sorted: the seat, or every seat of the
    /// role in this document (at least one).
    pub seats: Vec<Handle>,
    pub prompt: String,
    /// Where the result is posted; `None`: nowhere.
    pub deliver: Option<Delivery>,
    pub catch_up: CatchUp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleTarget {
    Seat(Handle),
    Role(String),
}

/// A channel, and optionally a thread in it, on the chat surface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Delivery {
    pub channel: String,
    pub thread: Option<String>,
}

/// A placement group pinned to node labels: its seats run only on a node
/// whose labels hold every pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementGroup {
    pub name: String,
    /// At least one `key = value` a node's `[node] labels` must hold.
    pub labels: BTreeMap<String, String>,
}

impl PlacementGroup {
    /// Whether a node with `labels` may run this group's seats.
    pub fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// A validated company document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Company {
    pub org: String,
    pub timezone: String,
    pub budget: Ceilings,
    pub roles: BTreeMap<String, Role>,
    pub seats: BTreeMap<Handle, Seat>,
    /// People the company knows (`[people.KEY]`), by key.
    pub people: BTreeMap<String, Person>,
    /// Every seat's and person's identities, derived from this document.
    #[serde(skip)]
    pub registry: Registry,
    pub integrations: BTreeMap<String, Integration>,
    pub schedules: BTreeMap<String, Schedule>,
    /// Placement groups pinned to node labels (`[placement.groups.NAME]`);
    /// a group seats name without declaring it runs on any seat node.
    pub placement: BTreeMap<String, PlacementGroup>,
    /// `[budgets] announce_park`: a seat whose work a full budget parks
    /// posts, once, to the reply its trigger is owed that it is out of
    /// budget until the window turns over. Default false: silence.
    pub announce_park: bool,
    /// `[memory] embedding`: the model recall compares meanings with;
    /// `None` when the company decided none (recall is by recency).
    pub embedding: Option<ModelRef>,
    /// SHA-256 of the document text, hex: names a revision's content.
    pub digest: String,
}

/// One problem in a document, at a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct DocError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for DocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}`: {}", self.path, self.message)
    }
}

/// Why a document was refused: every error found, each with its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(.errors))]
pub struct Invalid {
    pub errors: Vec<DocError>,
}

fn render(errors: &[DocError]) -> String {
    let mut s = format!(
        "the company document has {} error{}:",
        errors.len(),
        if errors.len() == 1 { "" } else { "s" }
    );
    for e in errors {
        s.push_str("\n  - ");
        s.push_str(&e.to_string());
    }
    s
}

impl Company {
    /// Parses and validates a document.
    ///
    /// ```
    /// use crewlet_company::{Company, seat_id};
    ///
    /// let doc = r#"
    ///     [org]
    ///     name = "Acme"
    ///     [roles.support]
    ///     system_prompt = "You answer questions in chat."
    ///     executor = [{ provider = "openai", model = "gpt-4.1", credentials = "${OPENAI_API_KEY}" }]
    ///     reviewer = { provider = "openai", model = "gpt-4.1-mini", credentials = "${OPENAI_API_KEY}" }
    ///     [seats]
    ///     ada = { role = "support" }
    /// "#;
    /// let company = Company::parse(doc)?;
    /// let ada = company.seat("ada").expect("ada is a seat");
    /// assert_eq!(company.role_of(ada).executor[0].model, "gpt-4.1");
    /// // Every node computes the same seat id, from the org and the handle.
    /// assert_eq!(ada.id, seat_id("Acme", &ada.handle));
    ///
    /// // Every problem at once, each at its path: a key written into the
    /// // document, and a seat of a role nobody defined.
    /// let bad = doc
    ///     .replace(r#""${OPENAI_API_KEY}" }]"#, r#""sk-live-123" }]"#)
    ///     .replace(r#"role = "support""#, r#"role = "sales""#);
    /// let err = Company::parse(&bad).unwrap_err();
    /// let paths: Vec<&str> = err.errors.iter().map(|e| e.path.as_str()).collect();
    /// assert_eq!(paths, ["roles.support.executor[0].credentials", "seats.ada.role"]);
    /// # Ok::<(), crewlet_company::Invalid>(())
    /// ```
    pub fn parse(text: &str) -> Result<Company, Invalid> {
        let value: toml::Value = toml::from_str(text).map_err(|e| Invalid {
            errors: vec![DocError {
                path: "(document)".into(),
                message: format!("not valid TOML: {}", e.message()),
            }],
        })?;
        let raw: raw::Document = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            Invalid {
                errors: vec![DocError {
                    path: if path == "." {
                        "(document)".into()
                    } else {
                        path
                    },
                    message: e
                        .into_inner()
                        .to_string()
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                }],
            }
        })?;
        let digest = hex(&Sha256::digest(text.as_bytes()));
        raw.validate(digest)
    }

    /// The seat with `handle`, if the company has one.
    pub fn seat(&self, handle: &str) -> Option<&Seat> {
        Handle::parse(handle).ok().and_then(|h| self.seats.get(&h))
    }

    /// Who claims `id` on `surface` (a delivery's source): a seat or a
    /// person of this document, if anyone.
    pub fn claimant(&self, surface: &str, id: &str) -> Option<&Claimant> {
        self.registry.claimant(surface, id)
    }

    /// The secret a delivery on `/webhooks/SOURCE[/HANDLE]` verifies with:
    /// the route's seat's own for the source, else the integration's;
    /// `None` when the document integrates no such source.
    pub fn route_secret(&self, source: &str, handle: Option<&str>) -> Option<&SecretRef> {
        let integration = self.integrations.get(source)?;
        let own = handle
            .and_then(|h| self.seat(h))
            .and_then(|s| s.signing_secrets.get(source));
        Some(own.unwrap_or(&integration.secret))
    }

    /// The seats' handles, in order.
    pub fn handles(&self) -> impl Iterator<Item = &Handle> {
        self.seats.keys()
    }

    /// The labels a seat's node must carry: its group's pin, or none for
    /// the default group and an undeclared one.
    pub fn pin_of(&self, seat: &Seat) -> Option<&PlacementGroup> {
        seat.group.as_ref().and_then(|g| self.placement.get(g))
    }

    /// The role of a seat.
    pub fn role_of(&self, seat: &Seat) -> &Role {
        &self.roles[&seat.role]
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;

/// A company as a node serves it: the document and the epoch it was
/// activated at (the config pointer's revision; 0 for a document given on
/// the command line and not activated through the pointer).
#[derive(Debug, Clone)]
pub struct Active {
    pub epoch: ConfigEpoch,
    pub company: std::sync::Arc<Company>,
}

impl Active {
    /// A document served as given, outside the config plane.
    pub fn local(company: Company) -> Active {
        Active {
            epoch: ConfigEpoch::default(),
            company: std::sync::Arc::new(company),
        }
    }

    /// The pointer epoch this company was applied at; `None` for a
    /// document served as given.
    pub fn applied_epoch(&self) -> Option<ConfigEpoch> {
        (self.epoch.get() > 0).then_some(self.epoch)
    }
}

/// The company a node serves now; readers take it by value at the start of
/// what they do (a turn, a delivery), so a change applies to what starts next.
#[derive(Debug, Clone)]
pub struct ActiveCompany {
    tx: std::sync::Arc<tokio::sync::watch::Sender<Option<Active>>>,
}

impl ActiveCompany {
    pub fn new(initial: Option<Active>) -> ActiveCompany {
        ActiveCompany {
            tx: std::sync::Arc::new(tokio::sync::watch::channel(initial).0),
        }
    }

    /// The company now, if any.
    pub fn current(&self) -> Option<Active> {
        self.tx.borrow().clone()
    }

    /// The pointer epoch of the company served now (see
    /// [`Active::applied_epoch`]).
    pub fn applied_epoch(&self) -> Option<ConfigEpoch> {
        self.tx.borrow().as_ref().and_then(Active::applied_epoch)
    }

    /// Replaces the company; watchers see the change.
    pub fn set(&self, next: Option<Active>) {
        self.tx.send_replace(next);
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<Active>> {
        self.tx.subscribe()
    }
}
