//! The file as written: every key optional, unknown keys refused. The
//! typed [`crate::NodeConfig`] is built from it (defaults and bounds are
//! applied there, once).

use super::*;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct File {
    pub node: Node,
    pub api: Api,
    pub stream: Stream,
    pub coordination: Coordination,
    pub logging: Logging,
    pub shutdown: Shutdown,
    pub models: Models,
    pub mcp: crate::mcp::raw::Mcp,
    pub secrets: Secrets,
    pub duties: crate::duties::raw::Duties,
    pub telemetry: crate::telemetry::raw::Telemetry,
    pub ingress: Ingress,
    pub plugins: Plugins,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ingress {
    pub record_refused: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Plugins {
    pub dirs: Vec<PathBuf>,
    /// Whether changed plugin files are swapped in while the node runs.
    pub reload: Option<bool>,
    /// `[plugins.grants.NAME]`: what this deployment grants a plugin.
    pub grants: BTreeMap<String, PluginGrant>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Secrets {
    pub keyring: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Node {
    pub id: Option<String>,
    pub roles: Option<Vec<Role>>,
    pub labels: BTreeMap<String, String>,
    pub data_dir: Option<PathBuf>,
    pub max_concurrent: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Api {
    pub host: Option<IpAddr>,
    pub port: Option<u16>,
    pub allowed_hosts: Option<Vec<String>>,
    pub max_connections: Option<usize>,
    pub header_timeout_seconds: Option<f64>,
    pub body_timeout_seconds: Option<f64>,
}

impl Api {
    pub(super) fn validate(self) -> Result<ApiConfig, (&'static str, String)> {
        let host = self.host.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let allowed_hosts = self.allowed_hosts.unwrap_or_default();
        for h in &allowed_hosts {
            let ok = !h.is_empty()
                && (h == "*"
                    || h.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b)));
            if !ok {
                return Err((
                    "api.allowed_hosts",
                    format!(
                        "{h:?} is not a host name: list names as clients send them in Host (e.g. \"crewlet.internal\"), or \"*\" for any"
                    ),
                ));
            }
        }
        if !host.is_loopback() && allowed_hosts.is_empty() {
            return Err((
                "api.host",
                format!(
                    "{host} is reachable from other machines; every route but /health, /ready and /webhooks needs an operator token there, and requests are answered only for the names in api.allowed_hosts — set api.allowed_hosts to the names clients use (or [\"*\"] behind a proxy that checks Host), or keep api.host = \"127.0.0.1\""
                ),
            ));
        }
        if self.max_connections == Some(0) {
            return Err((
                "api.max_connections",
                "expected at least 1 connection (leave it out to size it from the descriptor limit)".into(),
            ));
        }
        let timeout = |key: &'static str, v: Option<f64>, default: f64| {
            let v = v.unwrap_or(default);
            if v > 0.0 && v <= 3600.0 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err((
                    key,
                    format!("expected above 0 and at most 3600 seconds, found {v}"),
                ))
            }
        };
        Ok(ApiConfig {
            host,
            port: self.port.unwrap_or(DEFAULT_API_PORT),
            allowed_hosts,
            max_connections: self.max_connections,
            header_timeout: timeout(
                "api.header_timeout_seconds",
                self.header_timeout_seconds,
                10.0,
            )?,
            body_timeout: timeout("api.body_timeout_seconds", self.body_timeout_seconds, 30.0)?,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Urls {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stream {
    pub url: Option<Urls>,
    pub store_dir: Option<PathBuf>,
    pub port: Option<u16>,
    pub replicas: Option<usize>,
    pub nats_server: Option<PathBuf>,
    pub sync: Option<SyncPolicy>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    pub nkey_seed_file: Option<PathBuf>,
    pub creds_file: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub cluster: Option<crate::cluster::raw::Cluster>,
}

impl Stream {
    pub fn take_auth(&mut self) -> credentials::RawAuth {
        credentials::RawAuth {
            user: self.user.take(),
            password: self.password.take(),
            token: self.token.take(),
            nkey_seed_file: self.nkey_seed_file.take(),
            creds_file: self.creds_file.take(),
            tls_ca: self.tls_ca.take(),
            tls_cert: self.tls_cert.take(),
            tls_key: self.tls_key.take(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Coordination {
    #[serde(rename = "type")]
    pub kind: Option<CoordinationType>,
    pub lease_ttl_seconds: Option<u64>,
    pub heartbeat_seconds: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Logging {
    pub level: Option<String>,
    pub format: Option<LogFormat>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Shutdown {
    pub drain_notice_seconds: Option<f64>,
    pub drain_timeout_seconds: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Models {
    pub cooldown_floor_seconds: Option<u64>,
}

impl File {
    pub fn validate(
        mut self,
        label: &str,
        base: &Path,
        overrides: &Overrides,
    ) -> Result<NodeConfig, ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            file: label.to_owned(),
            key: key.to_owned(),
            message,
        };
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };

        if let Some(id) = &self.node.id {
            validate_node_id(id).map_err(|m| invalid("node.id", m.to_string()))?;
        }
        let mut roles = self.node.roles.unwrap_or_default();
        roles.sort();
        roles.dedup();
        if roles.is_empty() {
            roles = Role::ALL.to_vec();
        }
        let data_dir = match (&overrides.data_dir, self.node.data_dir) {
            (Some(cli), _) => cli.clone(),
            (None, Some(file)) => resolve(file),
            (None, None) => PathBuf::from(DEFAULT_DATA_DIR),
        };
        if data_dir.as_os_str().is_empty() {
            return Err(invalid("node.data_dir", "expected a non-empty path".into()));
        }
        let max_concurrent = self.node.max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT);
        if max_concurrent == 0 {
            return Err(invalid(
                "node.max_concurrent",
                "expected at least 1 turn in flight".into(),
            ));
        }

        let api = self.api.validate().map_err(|(key, m)| invalid(key, m))?;

        let replicas = self.stream.replicas.unwrap_or(1);
        if !(1..=5).contains(&replicas) {
            return Err(invalid(
                "stream.replicas",
                format!("expected 1 to 5 replicas (JetStream's range), found {replicas}"),
            ));
        }
        if replicas == 2 {
            return Err(invalid(
                "stream.replicas",
                "2 replicas have no quorum: losing either server stops every write, as 1 would, at twice the cost; use 3 (or 1)".into(),
            ));
        }
        let local = self.coordination.kind == Some(CoordinationType::Local);
        let many_urls = match &self.stream.url {
            Some(Urls::One(s)) => s.split(',').filter(|u| !u.trim().is_empty()).count() > 1,
            Some(Urls::Many(v)) => v.len() > 1,
            None => false,
        };
        if local && (many_urls || replicas > 1 || self.stream.cluster.is_some()) {
            return Err(invalid(
                "coordination.type",
                "`local` leases are held in this process and fence nothing on another node, so they cannot run on a NATS cluster (several `stream.url`s, `[stream.cluster]` or `stream.replicas` > 1); use `nats`".into(),
            ));
        }
        let auth = self.stream.take_auth();
        let mode = match self.stream.url {
            Some(urls) => {
                for (key, set) in [
                    ("stream.store_dir", self.stream.store_dir.is_some()),
                    ("stream.port", self.stream.port.is_some()),
                    ("stream.nats_server", self.stream.nats_server.is_some()),
                    ("stream.sync", self.stream.sync.is_some()),
                    ("stream.cluster", self.stream.cluster.is_some()),
                ] {
                    if set {
                        return Err(invalid(
                            key,
                            "applies to the embedded broker only; remove it, or remove `stream.url` to embed one".into(),
                        ));
                    }
                }
                let urls: Vec<String> = match urls {
                    Urls::One(s) => s.split(',').map(|u| u.trim().to_owned()).collect(),
                    Urls::Many(v) => v.into_iter().map(|u| u.trim().to_owned()).collect(),
                };
                if urls.is_empty() || urls.iter().any(String::is_empty) {
                    return Err(invalid(
                        "stream.url",
                        "expected one or more NATS URLs such as `nats://10.0.0.5:4222`".into(),
                    ));
                }
                let auth = auth
                    .validate(resolve)
                    .map_err(|(key, message)| invalid(key, message))?;
                StreamMode::External { urls, auth }
            }
            None => {
                if let Some(key) = auth.set_keys().first() {
                    return Err(invalid(
                        key,
                        "applies to an external NATS (`stream.url`) only; the embedded broker makes its own credential in the data dir".into(),
                    ));
                }
                let cluster = self
                    .stream
                    .cluster
                    .map(|c| c.validate())
                    .transpose()
                    .map_err(|(key, message)| invalid(key, message))?;
                match &cluster {
                    None if replicas > 1 => {
                        return Err(invalid(
                            "stream.replicas",
                            format!(
                                "{replicas} replicas need a NATS cluster, and this embedded broker is one server; cluster the fleet's embedded brokers with `[stream.cluster]`, set `stream.url` to an external cluster, or use 1"
                            ),
                        ));
                    }
                    Some(c) if replicas > c.known_size() => {
                        return Err(invalid(
                            "stream.replicas",
                            format!(
                                "{replicas} replicas need {replicas} servers, and `stream.cluster.routes` reach at most {} (with this one); add routes or lower the replicas",
                                c.known_size()
                            ),
                        ));
                    }
                    _ => {}
                }
                StreamMode::Embedded(EmbeddedBroker {
                    store_dir: self
                        .stream
                        .store_dir
                        .map(resolve)
                        .unwrap_or_else(|| data_dir.join("stream")),
                    port: self.stream.port.unwrap_or(0),
                    nats_server: self.stream.nats_server.map(resolve),
                    sync: self.stream.sync.unwrap_or(SyncPolicy::Always),
                    credential: data_dir.join("broker.nkey"),
                    cluster,
                })
            }
        };

        let ttl = self
            .coordination
            .lease_ttl_seconds
            .unwrap_or(DEFAULT_LEASE_TTL_SECONDS);
        let heartbeat = self
            .coordination
            .heartbeat_seconds
            .unwrap_or(DEFAULT_HEARTBEAT_SECONDS.min(ttl / 3).max(1));
        if ttl < 3 {
            return Err(invalid(
                "coordination.lease_ttl_seconds",
                format!("expected at least 3 seconds, found {ttl}"),
            ));
        }
        if heartbeat == 0 || heartbeat >= ttl {
            return Err(invalid(
                "coordination.heartbeat_seconds",
                format!("expected at least 1 and below the lease TTL ({ttl} s), found {heartbeat}"),
            ));
        }

        let logging = LoggingConfig {
            level: self.logging.level.unwrap_or_else(|| "info".into()),
            format: overrides
                .log_format
                .or(self.logging.format)
                .unwrap_or(LogFormat::Text),
        };

        let seconds = |key: &str, v: Option<f64>, default: f64| {
            let v = v.unwrap_or(default);
            if (0.0..=3600.0).contains(&v) {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(invalid(
                    key,
                    format!("expected 0 to 3600 seconds, found {v}"),
                ))
            }
        };
        let shutdown = ShutdownConfig {
            drain_notice: seconds(
                "shutdown.drain_notice_seconds",
                self.shutdown.drain_notice_seconds,
                0.0,
            )?,
            drain_timeout: seconds(
                "shutdown.drain_timeout_seconds",
                self.shutdown.drain_timeout_seconds,
                120.0,
            )?,
        };

        let floor = self
            .models
            .cooldown_floor_seconds
            .unwrap_or(DEFAULT_COOLDOWN_FLOOR_SECONDS);
        if !(COOLDOWN_PULL_SECONDS..=MAX_COOLDOWN_FLOOR_SECONDS).contains(&floor) {
            return Err(invalid(
                "models.cooldown_floor_seconds",
                format!(
                    "expected {COOLDOWN_PULL_SECONDS} to {MAX_COOLDOWN_FLOOR_SECONDS} seconds, found {floor}: peers pull the fleet's cooldowns every {COOLDOWN_PULL_SECONDS} s, so a shorter cooldown can end before any peer reads it, and the cooldowns bucket keeps a record for a day"
                ),
            ));
        }

        let mcp = self
            .mcp
            .validate(base)
            .map_err(|(key, message)| invalid(&key, message))?;

        let duties = self
            .duties
            .validate()
            .map_err(|(key, message)| invalid(key, message))?;

        let telemetry = self
            .telemetry
            .validate()
            .map_err(|(key, message)| invalid(key, message))?;

        let record_refused = self.ingress.record_refused.unwrap_or(0);
        if record_refused > MAX_RECORD_REFUSED {
            return Err(invalid(
                "ingress.record_refused",
                format!(
                    "expected 0 to {MAX_RECORD_REFUSED}, found {record_refused}: the newest this many refused requests are kept in <data_dir>/refused for `crewlet plugins try`"
                ),
            ));
        }

        for (name, grant) in &self.plugins.grants {
            let key = format!("plugins.grants.{name}");
            if !crate::valid_plugin_name(name) {
                return Err(invalid(
                    &key,
                    "a plugin's name is 1 to 63 characters of a-z, 0-9 and -, starting with a letter".into(),
                ));
            }
            if grant == &PluginGrant::default() {
                return Err(invalid(
                    &key,
                    "grants nothing; set what it adds (base_url, allowed_outbound_hosts, routes, max_body_bytes, reads) or denies (denied_outbound_hosts, denied_routes, denied_reads), or remove the table".into(),
                ));
            }
        }
        let plugin_grants = self.plugins.grants;

        let keyring = self
            .secrets
            .keyring
            .map(resolve)
            .unwrap_or_else(|| data_dir.join("keyring"));
        Ok(NodeConfig {
            source: None,
            node_id: self.node.id,
            roles,
            labels: self.node.labels,
            data_dir,
            max_concurrent,
            api,
            stream: StreamConfig { mode, replicas },
            coordination: CoordinationConfig {
                kind: self.coordination.kind.unwrap_or(CoordinationType::Nats),
                lease_ttl: Duration::from_secs(ttl),
                heartbeat: Duration::from_secs(heartbeat),
            },
            logging,
            shutdown,
            models: ModelsConfig {
                cooldown_floor: Duration::from_secs(floor),
            },
            mcp,
            secrets: SecretsConfig { keyring },
            duties,
            telemetry,
            record_refused,
            plugin_dirs: self.plugins.dirs.into_iter().map(resolve).collect(),
            plugin_reload: self.plugins.reload.unwrap_or(true),
            plugin_grants,
        })
    }
}
