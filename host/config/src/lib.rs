//! Tier A: the node configuration a process starts from.
//!
//! A node reads one TOML file (or none: every key has a default), applies
//! `${VAR}` interpolation to its string values and validates it into a
//! [`NodeConfig`]. Loading is pure: it reads the file and the environment and
//! writes nothing, so a bad configuration stops a node before it has touched
//! its data dir. Every error names the file, the key and what was expected.
//!
//! Relative paths in the file resolve against the file's own directory;
//! paths given on the command line resolve against the working directory.

mod cluster;
mod credentials;
pub mod duties;
mod interpolate;
pub mod mcp;
pub mod scan;
pub mod telemetry;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use cluster::{ClusterConfig, MIN_ROUTE_SECRET};
pub use credentials::{NatsAuth, NatsCredentials, NatsTls};
pub use duties::DutiesConfig;
pub use interpolate::{InterpolateError, interpolate_str};
pub use mcp::{AllowedCommand, McpConfig};
pub use telemetry::TelemetryConfig;

/// The most refused requests `[ingress] record_refused` may keep.
pub const MAX_RECORD_REFUSED: usize = 1000;

/// Lease TTL for seats and presence when the file does not set one.
pub const DEFAULT_LEASE_TTL_SECONDS: u64 = 45;
/// Heartbeat on which seat and presence leases are renewed.
pub const DEFAULT_HEARTBEAT_SECONDS: u64 = 15;
/// Turns one node runs at once when the file does not say.
pub const DEFAULT_MAX_CONCURRENT: usize = 32;
/// Port of the HTTP surface when the file does not say.
pub const DEFAULT_API_PORT: u16 = 7420;
/// Data dir when neither the file nor the command line names one.
pub const DEFAULT_DATA_DIR: &str = "crewlet-data";
/// The least a credential cooldown lasts when the file does not say.
pub const DEFAULT_COOLDOWN_FLOOR_SECONDS: u64 = 60;
/// How often a node pulls the fleet's credential cooldowns. Not a key: it
/// is what a cooldown floor is judged against.
pub const COOLDOWN_PULL_SECONDS: u64 = 15;
/// The longest floor: the cooldowns bucket forgets a record after a day.
pub const MAX_COOLDOWN_FLOOR_SECONDS: u64 = 24 * 3600;

/// What a node does. Declaring none means all four.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Holds the company's records.
    Data,
    /// Serves webhooks, the API and the dashboard.
    Ingress,
    /// Holds seats and runs their turns.
    Seats,
    /// Runs the company-wide singleton duties.
    Workers,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Data, Role::Ingress, Role::Seats, Role::Workers];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Data => "data",
            Role::Ingress => "ingress",
            Role::Seats => "seats",
            Role::Workers => "workers",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated node configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// The file it was read from, if any.
    pub source: Option<PathBuf>,
    /// Explicit node id; `None` means the stable id kept in the data dir.
    pub node_id: Option<String>,
    /// Never empty: an empty list in the file becomes all four.
    pub roles: Vec<Role>,
    pub labels: BTreeMap<String, String>,
    pub data_dir: PathBuf,
    pub max_concurrent: usize,
    pub api: ApiConfig,
    pub stream: StreamConfig,
    pub coordination: CoordinationConfig,
    pub logging: LoggingConfig,
    pub shutdown: ShutdownConfig,
    pub models: ModelsConfig,
    /// What the company document may make this node run (`[mcp]`).
    pub mcp: McpConfig,
    pub secrets: SecretsConfig,
    /// `[duties]`: the singleton duties' cadence and this node's horizons.
    pub duties: DutiesConfig,
    /// `[telemetry]`: where traces go (nowhere by default).
    pub telemetry: TelemetryConfig,
    /// `[ingress] record_refused`: how many refused webhook requests are
    /// kept in `<data_dir>/refused` for replay (0, the default: none).
    pub record_refused: usize,
    /// `[plugins] dirs`: plugin folders (relative to the file), read before
    /// any `--plugins`.
    pub plugin_dirs: Vec<PathBuf>,
    /// `[plugins] reload` (on by default): a changed manifest or component
    /// in a plugins folder is validated and swapped in without a restart.
    pub plugin_reload: bool,
    /// `[plugins.grants.NAME]`: what this deployment adds to each plugin's
    /// manifest and denies it (checked against the catalogue at start).
    pub plugin_grants: BTreeMap<String, PluginGrant>,
}

/// One plugin's operator grant as written: what it adds to the manifest —
/// a provider's `base_url` (whose origin comes with it) and more
/// `allowed_outbound_hosts`, a webhook plugin's `routes` and
/// `max_body_bytes`, a module's `reads` — and what it denies, declared or
/// not: `denied_outbound_hosts`, `denied_routes`, `denied_reads`. The
/// plugin host parses and applies it against the manifest it names,
/// refusing it with the key's path.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginGrant {
    pub base_url: Option<String>,
    pub allowed_outbound_hosts: Vec<String>,
    pub denied_outbound_hosts: Vec<String>,
    pub routes: Vec<String>,
    pub denied_routes: Vec<String>,
    pub max_body_bytes: Option<u64>,
    pub reads: Vec<String>,
    pub denied_reads: Vec<String>,
}

/// Whether `name` can be a plugin's name: 1 to 63 of `a-z 0-9 -`,
/// starting with a letter.
pub(crate) fn valid_plugin_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Where the keys that seal the secrets bucket live (see `credentials`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretsConfig {
    /// Defaults to `<data_dir>/keyring`.
    pub keyring: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    pub host: IpAddr,
    /// `0` means the node serves no HTTP at all.
    pub port: u16,
    /// `Host` names answered beyond loopback and the bound address; `*`
    /// answers any. Required (non-empty) for a non-loopback `host`.
    pub allowed_hosts: Vec<String>,
    /// Connections served at once; `None` sizes it from the descriptor
    /// limit at start.
    pub max_connections: Option<usize>,
    /// A request's headers must be complete this long after their first byte.
    pub header_timeout: Duration,
    /// A request's body must be complete this long after the request began.
    pub body_timeout: Duration,
}

/// Where the event stream and the coordination store live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    pub mode: StreamMode,
    /// Replicas for every stream and bucket this node creates.
    pub replicas: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamMode {
    /// The node supervises its own nats-server child.
    Embedded(EmbeddedBroker),
    /// An external NATS server or cluster; no child.
    External { urls: Vec<String>, auth: NatsAuth },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedBroker {
    /// JetStream store dir; defaults to `<data_dir>/stream`.
    pub store_dir: PathBuf,
    /// Client port on 127.0.0.1; `0` picks a free one at start.
    pub port: u16,
    /// Explicit nats-server binary; otherwise found by the usual search.
    pub nats_server: Option<PathBuf>,
    pub sync: SyncPolicy,
    /// The node's nkey seed for its own broker: `<data_dir>/broker.nkey`,
    /// made at the first start, mode 0600.
    pub credential: PathBuf,
    /// `[stream.cluster]`: this server's routes to its peers' embedded
    /// servers; `None` runs it alone.
    pub cluster: Option<ClusterConfig>,
}

/// When the broker fsyncs JetStream writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncPolicy {
    /// `sync_interval: always`: an acknowledged write survives a crash.
    Always,
    /// The server's own lazy default (every two minutes): faster, and an
    /// acknowledged write can be lost when the machine crashes.
    ServerDefault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoordinationType {
    /// Leases on the fleet's JetStream KV: required for more than one node.
    Nats,
    /// Leases held in process: a single node only. Shared buckets stay on NATS.
    Local,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinationConfig {
    pub kind: CoordinationType,
    pub lease_ttl: Duration,
    pub heartbeat: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    /// A `tracing` filter directive, e.g. `info` or `crewlet=debug,info`.
    pub level: String,
    pub format: LogFormat,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownConfig {
    /// How long `/ready` answers 503 before the drain proceeds, so a load
    /// balancer polling it stops routing here before anything closes.
    pub drain_notice: Duration,
    /// Upper bound on the whole drain before subsystems are stopped anyway.
    pub drain_timeout: Duration,
}

/// How this node's model layer benches credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelsConfig {
    /// The least any credential cooldown lasts, whatever a vendor advised.
    /// Never under [`COOLDOWN_PULL_SECONDS`]: peers learn of a bench only on
    /// their next pull, and one that ended before it would have every peer
    /// pay its own 429 to learn what this node already knew.
    pub cooldown_floor: Duration,
}

/// Values from the command line that win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub log_format: Option<LogFormat>,
}

/// Why a configuration was refused. Each names the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read the configuration: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: not valid TOML: {message}")]
    Syntax { file: String, message: String },
    #[error("{file}: key `{key}`: {message}")]
    Invalid {
        file: String,
        key: String,
        message: String,
    },
    #[error(
        "{file}: key `{key}`: environment variable `{var}` is not set (referenced as `${{{var}}}`); export it or give a fallback with `${{{var}:-value}}`"
    )]
    MissingVar {
        file: String,
        key: String,
        var: String,
    },
}

impl NodeConfig {
    /// Reads and validates `file` (or defaults when `None`), with `lookup`
    /// answering environment variables. Writes nothing.
    pub fn load(
        file: Option<&Path>,
        overrides: &Overrides,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<NodeConfig, ConfigError> {
        let (label, text) = match file {
            Some(path) => {
                let label = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    file: label.clone(),
                    source,
                })?;
                (label, text)
            }
            None => ("<defaults>".to_owned(), String::new()),
        };
        let base = file
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        Self::from_toml(&label, &text, &base, overrides, lookup).map(|mut cfg| {
            cfg.source = file.map(Path::to_path_buf);
            cfg
        })
    }

    /// Parses a document whose relative paths resolve against `base`.
    pub fn from_toml(
        label: &str,
        text: &str,
        base: &Path,
        overrides: &Overrides,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<NodeConfig, ConfigError> {
        let mut doc: toml::Value = if text.trim().is_empty() {
            toml::Value::Table(Default::default())
        } else {
            toml::from_str(text).map_err(|e| ConfigError::Syntax {
                file: label.to_owned(),
                message: e.to_string().trim_end().to_owned(),
            })?
        };
        interpolate::interpolate_tree(&mut doc, lookup).map_err(|(key, err)| match err {
            InterpolateError::Unset { var } => ConfigError::MissingVar {
                file: label.to_owned(),
                key,
                var,
            },
            InterpolateError::Malformed { detail } => ConfigError::Invalid {
                file: label.to_owned(),
                key,
                message: detail,
            },
        })?;
        let raw: raw::File = serde_path_to_error::deserialize(doc).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Invalid {
                file: label.to_owned(),
                key: if key == "." {
                    "(top level)".into()
                } else {
                    key
                },
                // toml appends "in `table`"; the key path already says where.
                message: e
                    .into_inner()
                    .to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            }
        })?;
        raw.validate(label, base, overrides)
    }

    /// Every role this node performs.
    pub fn has_role(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

mod raw;

/// A node id written against its rule; whoever wrote it (the node
/// configuration, `--node-id`, the `node-id` file) is to blame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadNodeId {
    #[error("expected 1 to 64 characters, found {0}")]
    Length(usize),
    #[error("expected letters, digits, `-` or `_`, found {bad:?} in {id:?}")]
    Character { bad: char, id: String },
}

/// A node id is one segment of a lease name (`node:ID`) and a file name:
/// letters, digits, `-` and `_`, 1 to 64 of them.
pub fn validate_node_id(id: &str) -> Result<(), BadNodeId> {
    if id.is_empty() || id.len() > 64 {
        return Err(BadNodeId::Length(id.len()));
    }
    if let Some(bad) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(BadNodeId::Character {
            bad,
            id: id.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "NATS_HOST").then(|| "10.1.2.3".to_owned())
    }

    fn parse(text: &str) -> Result<NodeConfig, ConfigError> {
        NodeConfig::from_toml(
            "node.toml",
            text,
            Path::new("/etc/crewlet"),
            &Overrides::default(),
            &env,
        )
    }

    #[test]
    fn a_bad_mcp_entry_names_its_key() {
        let err = parse("[mcp]\nallowed_commands = [42]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("key `mcp.allowed_commands[0]`"), "{err}");
        assert!(err.contains("a program's absolute path"), "{err}");
        let err = parse("[mcp]\nallowed_commands = [\"npx\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `mcp.allowed_commands[0]`") && err.contains("command -v npx"),
            "{err}"
        );
        let cfg = parse("[mcp]\nallowed_dirs = [\"work\"]\n").unwrap();
        assert_eq!(cfg.mcp.allowed_dirs, [PathBuf::from("/etc/crewlet/work")]);
        assert_eq!(cfg.mcp.allowed_commands, vec![AllowedCommand::own_binary()]);
    }

    #[test]
    fn a_grant_reads_what_it_adds_and_what_it_denies() {
        let cfg = parse(
            "[plugins.grants.openai]\ndenied_outbound_hosts = [\"https://api.openai.com\"]\n\
             [plugins.grants.github]\nroutes = [\"/webhooks/ghe\"]\ndenied_routes = [\"/webhooks/github\"]\n\
             [plugins.grants.board]\nreads = [\"a.b\"]\ndenied_reads = [\"c.d\"]\n",
        )
        .unwrap();
        let g = &cfg.plugin_grants;
        assert_eq!(
            g["openai"].denied_outbound_hosts,
            ["https://api.openai.com"]
        );
        assert_eq!(g["github"].routes, ["/webhooks/ghe"]);
        assert_eq!(g["github"].denied_routes, ["/webhooks/github"]);
        assert_eq!(
            (&g["board"].reads[..], &g["board"].denied_reads[..]),
            (&["a.b".to_string()][..], &["c.d".to_string()][..])
        );
        let err = parse("[plugins.grants.openai]\ndeny = [\"x\"]\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugins.grants.openai"), "{err}");
        let err = parse("[plugins.grants.openai]\n").unwrap_err().to_string();
        assert!(
            err.contains("grants nothing") && err.contains("denied_outbound_hosts"),
            "{err}"
        );
    }

    #[test]
    fn empty_file_is_all_defaults() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg.roles, Role::ALL.to_vec());
        assert_eq!(cfg.max_concurrent, 32);
        assert_eq!(cfg.coordination.lease_ttl, Duration::from_secs(45));
        assert_eq!(cfg.coordination.heartbeat, Duration::from_secs(15));
        assert_eq!(cfg.api.port, DEFAULT_API_PORT);
        match cfg.stream.mode {
            StreamMode::Embedded(b) => {
                assert_eq!(b.store_dir, PathBuf::from(DEFAULT_DATA_DIR).join("stream"));
                assert_eq!(b.sync, SyncPolicy::Always);
                assert_eq!(b.port, 0);
            }
            other => panic!("expected embedded, got {other:?}"),
        }
    }

    #[test]
    fn full_file_round_trips() {
        let cfg = parse(
            r#"
            [node]
            id = "edge-1"
            roles = ["seats", "ingress", "seats"]
            data_dir = "data"
            max_concurrent = 8
            labels = { zone = "eu" }
            [api]
            host = "0.0.0.0"
            port = 9000
            allowed_hosts = ["crewlet.internal"]
            [stream]
            url = "nats://${NATS_HOST}:4222, nats://b:4222"
            replicas = 3
            [coordination]
            lease_ttl_seconds = 30
            [logging]
            format = "json"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.node_id.as_deref(), Some("edge-1"));
        assert_eq!(cfg.roles, vec![Role::Ingress, Role::Seats]);
        assert_eq!(cfg.data_dir, PathBuf::from("/etc/crewlet/data"));
        assert_eq!(cfg.labels.get("zone").map(String::as_str), Some("eu"));
        assert_eq!(
            cfg.stream.mode,
            StreamMode::External {
                urls: vec!["nats://10.1.2.3:4222".into(), "nats://b:4222".into()],
                auth: NatsAuth::default(),
            }
        );
        assert_eq!(cfg.coordination.heartbeat, Duration::from_secs(10));
        assert_eq!(cfg.logging.format, LogFormat::Json);
    }

    #[test]
    fn a_non_loopback_host_needs_allowed_hosts_and_the_edge_keys_are_bounded() {
        let err = parse("[api]\nhost = \"0.0.0.0\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `api.host`") && err.contains("api.allowed_hosts"),
            "{err}"
        );
        let ok = parse("[api]\nhost = \"10.0.0.2\"\nallowed_hosts = [\"*\"]\n").unwrap();
        assert_eq!(ok.api.allowed_hosts, vec!["*".to_owned()]);
        assert_eq!(ok.api.header_timeout, Duration::from_secs(10));
        for (bad, key) in [
            ("allowed_hosts = [\"evil/x\"]", "api.allowed_hosts"),
            ("max_connections = 0", "api.max_connections"),
            ("header_timeout_seconds = 0", "api.header_timeout_seconds"),
            ("body_timeout_seconds = 7200", "api.body_timeout_seconds"),
        ] {
            let err = parse(&format!("[api]\n{bad}\n")).unwrap_err().to_string();
            assert!(err.contains(&format!("key `{key}`")), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let err = parse("[stream]\nreplica = 3\n").unwrap_err().to_string();
        assert!(
            err.starts_with("node.toml: key `stream.replica`: unknown field `replica`"),
            "{err}"
        );
        assert!(err.contains("unknown field `replica`"), "{err}");
        assert!(err.contains("replicas"), "lists what is expected: {err}");
    }

    #[test]
    fn wrong_type_names_key_and_expectation() {
        let err = parse("[coordination]\nlease_ttl_seconds = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `coordination.lease_ttl_seconds`"),
            "{err}"
        );
        assert!(err.contains("expected u64"), "{err}");
    }

    #[test]
    fn missing_variable_names_key_and_variable() {
        let err = parse("[stream]\nurl = \"nats://${NATS_PASSWORD}@x\"\n").unwrap_err();
        assert!(
            matches!(&err, ConfigError::MissingVar { key, var, .. }
            if key == "stream.url" && var == "NATS_PASSWORD"),
            "{err}"
        );
    }

    #[test]
    fn embedded_only_keys_are_refused_with_an_external_url() {
        let err = parse("[stream]\nurl = \"nats://a\"\nport = 4222\n").unwrap_err();
        assert!(err.to_string().contains("key `stream.port`"), "{err}");
    }

    #[test]
    fn two_replicas_and_local_leases_on_a_cluster_are_refused_by_key() {
        let err = parse("[stream]\nurl = \"nats://a,nats://b,nats://c\"\nreplicas = 2\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("key `stream.replicas`"), "{err}");
        assert!(err.contains("no quorum"), "{err}");
        for stream in [
            "url = \"nats://a, nats://b\"",
            "url = [\"nats://a\", \"nats://b\"]",
            "url = \"nats://a\"\nreplicas = 3",
        ] {
            let err = parse(&format!(
                "[stream]\n{stream}\n[coordination]\ntype = \"local\"\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains("key `coordination.type`"), "{stream}: {err}");
        }
        // One server, local leases: a single node, as documented.
        parse("[stream]\nurl = \"nats://a\"\n[coordination]\ntype = \"local\"\n").unwrap();
    }

    #[test]
    fn embedded_broker_cannot_replicate() {
        let err = parse("[stream]\nreplicas = 3\n").unwrap_err().to_string();
        assert!(err.contains("need a NATS cluster"), "{err}");
    }

    #[test]
    fn bad_role_and_bad_node_id_are_refused() {
        let err = parse("[node]\nroles = [\"chef\"]\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key `node.roles[0]`") || err.contains("key `node.roles`"),
            "{err}"
        );
        assert!(err.contains("unknown variant `chef`"), "{err}");
        let err = parse("[node]\nid = \"a:b\"\n").unwrap_err().to_string();
        assert!(err.contains("key `node.id`"), "{err}");
    }

    #[test]
    fn heartbeat_must_stay_below_ttl() {
        let err = parse("[coordination]\nlease_ttl_seconds = 10\nheartbeat_seconds = 10\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("coordination.heartbeat_seconds"), "{err}");
    }

    #[test]
    fn the_cooldown_floor_is_a_minute_unless_configured() {
        assert_eq!(
            parse("").unwrap().models.cooldown_floor,
            Duration::from_secs(60)
        );
        let cfg = parse("[models]\ncooldown_floor_seconds = 120\n").unwrap();
        assert_eq!(cfg.models.cooldown_floor, Duration::from_secs(120));
        let at_pull = parse("[models]\ncooldown_floor_seconds = 15\n").unwrap();
        assert_eq!(at_pull.models.cooldown_floor, Duration::from_secs(15));
    }

    #[test]
    fn a_cooldown_floor_under_the_pull_interval_is_refused_naming_the_key() {
        for bad in [0, 1, 14, 86_401] {
            let err = parse(&format!("[models]\ncooldown_floor_seconds = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with(
                    "node.toml: key `models.cooldown_floor_seconds`: expected 15 to 86400 seconds"
                ),
                "{err}"
            );
            assert!(err.contains(&format!("found {bad}")), "{err}");
        }
        let err = parse("[models]\ncooldown_floor_seconds = 1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("every 15 s"), "says why: {err}");
    }

    #[test]
    fn syntax_error_names_the_file() {
        let err = parse("[node\n").unwrap_err().to_string();
        assert!(err.starts_with("node.toml: not valid TOML"), "{err}");
    }

    #[test]
    fn cli_data_dir_wins() {
        let cfg = NodeConfig::from_toml(
            "node.toml",
            "[node]\ndata_dir = \"x\"\n",
            Path::new("/etc"),
            &Overrides {
                data_dir: Some(PathBuf::from("/tmp/y")),
                log_format: None,
            },
            &env,
        )
        .unwrap();
        assert_eq!(cfg.data_dir, PathBuf::from("/tmp/y"));
    }
}
