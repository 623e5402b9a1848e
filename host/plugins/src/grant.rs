//! Operator grants: what a deployment adds to a plugin's manifest, and
//! what it takes away.
//!
//! Rules, and why:
//! - **Held = (declared + added) − denied.** A manifest says what its
//!   author's plugin needs anywhere; the node's configuration
//!   (`[plugins.grants.NAME]`) says what this deployment adds — a
//!   provider's base URL (a proxy, a self-hosted server) and the outbound
//!   hosts that go with it, a webhook's extra routes and body limit, a
//!   module's extra reads — and what it denies: an outbound host, a
//!   route, a bucket read, whoever declared it. Nothing a plugin ships can
//!   widen what it gets; an operator's grant is explicit and named.
//! - **Resolved once, at load, into the manifest the runtime enforces**, so
//!   each kind has one choke point (the outbound policy, the module's
//!   `authorize`, the route lookup, the edge's body cap) and none learns
//!   there are two sources. What the operator added and denied stays on
//!   the manifest ([`Granted`]), each with its key: for `plugins list` and
//!   `GET /plugins`, and for the refusal of a denied permission
//!   ([`crate::manifest::NotHeld`]), which names the key that denies it.
//! - **Refused with the key's path** (`plugins.grants.openai.base_url`):
//!   a grant for a plugin the catalogue does not have, a key of a kind the
//!   plugin is not, a value that does not parse, or one both added and
//!   denied stops the start before anything runs. A deny the manifest
//!   does not declare is kept: it stands for every version of the plugin,
//!   so a hot-reloaded version that declares it is narrowed too.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::path::Path;
//! use crewlet_plugins::Catalogue;
//! use crewlet_plugins::grant::Grant;
//! use crewlet_plugins::manifest::{Manifest, NotHeld, Origin, Permission, Permissions};
//!
//! let manifest = Manifest::parse(
//!     Path::new("/plugins/openai/plugin.toml"),
//!     r#"
//! name = "openai"
//! version = "1.0.0"
//! kind = "provider"
//! component = "openai.wasm"
//! [provider]
//! base_url = "https://api.openai.com/v1"
//! allowed_outbound_hosts = ["https://api.openai.com", "https://status.openai.com"]
//! "#,
//! )?;
//! let mut catalogue = Catalogue { plugins: vec![manifest] };
//! // The operator sends the plugin through a proxy and denies the status page.
//! let grant = Grant {
//!     base_url: Some("http://10.0.0.5:4000/v1".into()),
//!     denied_outbound_hosts: vec!["https://status.openai.com".into()],
//!     ..Grant::default()
//! };
//! catalogue.apply_grants(&BTreeMap::from([("openai".into(), grant)]), "node.toml")?;
//!
//! let openai = &catalogue.plugins[0];
//! let Permissions::Provider { allowed_outbound_hosts, .. } = &openai.permissions else {
//!     unreachable!()
//! };
//! let held: Vec<String> = allowed_outbound_hosts.iter().map(|o| o.to_string()).collect();
//! assert_eq!(held, ["https://api.openai.com:443", "http://10.0.0.5:4000"]);
//!
//! // A call to the denied host is refused like an undeclared one, naming the key.
//! let status = Origin::parse("https://status.openai.com")?;
//! let why = openai.granted.refusal(Permission::Outbound(status), &openai.file);
//! assert!(matches!(why, NotHeld::Denied { .. }));
//! assert!(why.to_string().contains("`plugins.grants.openai.denied_outbound_hosts[0]` in node.toml"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;

use crate::catalogue::Catalogue;
use crate::manifest::{
    ByOperator, Granted, Kind, MAX_GRANTED_BODY, Manifest, Origin, Permission, Permissions,
    check_route, read_of,
};

/// One plugin's grant as the configuration states it: what it adds to
/// the manifest, and what it denies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// A provider's base URL, replacing its manifest's; its origin is
    /// granted with it.
    pub base_url: Option<String>,
    /// More origins a provider may reach.
    pub allowed_outbound_hosts: Vec<String>,
    /// Origins a provider may not reach, whoever declared them.
    pub denied_outbound_hosts: Vec<String>,
    /// More routes a webhook plugin serves.
    pub routes: Vec<String>,
    /// Routes a webhook plugin does not serve, declared or not.
    pub denied_routes: Vec<String>,
    /// A webhook plugin's body limit.
    pub max_body_bytes: Option<u64>,
    /// More buckets (`module.bucket`) a module reads.
    pub reads: Vec<String>,
    /// Buckets a module does not read, declared or not.
    pub denied_reads: Vec<String>,
}

/// A grant refused, naming its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: `plugins.grants.{plugin}{field}`: {problem}")]
pub struct GrantError {
    /// The configuration file (or what stands for it).
    pub file: String,
    pub plugin: String,
    /// `.base_url`, `.allowed_outbound_hosts[1]`, … (empty: the table).
    pub field: String,
    pub problem: String,
}

impl Catalogue {
    /// Applies `grants` (by plugin name, read from `source`) to the
    /// manifests they name, so each manifest's `permissions` are what the
    /// plugin holds; the first that is wrong is refused whole.
    pub fn apply_grants(
        &mut self,
        grants: &BTreeMap<String, Grant>,
        source: &str,
    ) -> Result<(), GrantError> {
        for (name, grant) in grants {
            let refuse = |field: &str, problem: String| GrantError {
                file: source.to_string(),
                plugin: name.clone(),
                field: field.to_string(),
                problem,
            };
            let Some(manifest) = self.plugins.iter_mut().find(|m| &m.name == name) else {
                let known: Vec<&str> = self.plugins.iter().map(|m| m.name.as_str()).collect();
                return Err(refuse(
                    "",
                    format!(
                        "no plugin of that name in the plugin dirs (they hold: {}); fix the name or remove the table",
                        known.join(", ")
                    ),
                ));
            };
            // Resolved on a copy: a refused grant leaves the manifest whole.
            let mut resolved = manifest.clone();
            apply(&mut resolved, grant, source)
                .map_err(|(field, problem)| refuse(&field, problem))?;
            *manifest = resolved;
        }
        Ok(())
    }
}

/// A field's problem: the field (`.routes[1]`) and what is wrong.
type Refused = (String, String);

/// Each item of the list at `field`, parsed, with its own field.
fn parsed<T, E: std::fmt::Display>(
    items: &[String],
    field: &str,
    parse: impl Fn(&str) -> Result<T, E>,
) -> Result<Vec<(T, String)>, Refused> {
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!(".{field}[{i}]");
        out.push((parse(item).map_err(|p| (at.clone(), p.to_string()))?, at));
    }
    Ok(out)
}

/// What one grant adds and denies of one kind, resolved against what the
/// manifest declares (`held`): the adds joined, the denies taken out.
struct Resolve<'a> {
    prefix: String,
    added: &'a mut Vec<ByOperator>,
    denied: &'a mut Vec<ByOperator>,
}

impl Resolve<'_> {
    fn key(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    fn apply<T: PartialEq + Clone + std::fmt::Display>(
        &mut self,
        held: &mut Vec<T>,
        adds: Vec<(T, String)>,
        denies: Vec<(T, String)>,
        permission: impl Fn(T) -> Permission,
    ) -> Result<(), Refused> {
        for (item, field) in adds {
            if let Some((_, deny)) = denies.iter().find(|(d, _)| d == &item) {
                let key = self.key(deny);
                return Err((
                    field,
                    format!("`{item}` is also denied by `{key}`; keep one of the two"),
                ));
            }
            if !held.contains(&item) {
                held.push(item.clone());
                let key = self.key(&field);
                self.added.push(ByOperator {
                    permission: permission(item),
                    key,
                });
            }
        }
        held.retain(|h| !denies.iter().any(|(d, _)| d == h));
        for (item, field) in denies {
            let key = self.key(&field);
            self.denied.push(ByOperator {
                permission: permission(item),
                key,
            });
        }
        Ok(())
    }
}

fn apply(manifest: &mut Manifest, grant: &Grant, source: &str) -> Result<(), Refused> {
    let kind = manifest.kind;
    let keys = [
        ("base_url", grant.base_url.is_some(), Kind::Provider),
        (
            "allowed_outbound_hosts",
            !grant.allowed_outbound_hosts.is_empty(),
            Kind::Provider,
        ),
        (
            "denied_outbound_hosts",
            !grant.denied_outbound_hosts.is_empty(),
            Kind::Provider,
        ),
        ("routes", !grant.routes.is_empty(), Kind::Webhook),
        (
            "denied_routes",
            !grant.denied_routes.is_empty(),
            Kind::Webhook,
        ),
        (
            "max_body_bytes",
            grant.max_body_bytes.is_some(),
            Kind::Webhook,
        ),
        ("reads", !grant.reads.is_empty(), Kind::Module),
        ("denied_reads", !grant.denied_reads.is_empty(), Kind::Module),
    ];
    if let Some((field, _, wanted)) = keys.iter().find(|(_, set, wanted)| *set && *wanted != kind) {
        return Err((
            format!(".{field}"),
            format!(
                "only a {} plugin takes it, and `{}` is a {} plugin",
                wanted.world(),
                manifest.name,
                kind.world()
            ),
        ));
    }
    let (mut added, mut denied) = (Vec::new(), Vec::new());
    let mut resolve = Resolve {
        prefix: format!("plugins.grants.{}", manifest.name),
        added: &mut added,
        denied: &mut denied,
    };
    let name = manifest.name.clone();
    match &mut manifest.permissions {
        Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } => {
            let mut adds = Vec::new();
            if let Some(url) = &grant.base_url {
                let origin =
                    Origin::parse(url).map_err(|p| (".base_url".to_string(), p.to_string()))?;
                *base_url = url.trim_end_matches('/').to_string();
                let key = resolve.key(".base_url");
                resolve.added.push(ByOperator {
                    permission: Permission::BaseUrl(base_url.clone()),
                    key,
                });
                adds.push((origin, ".base_url".to_string()));
            }
            let hosts = &grant.allowed_outbound_hosts;
            adds.extend(parsed(hosts, "allowed_outbound_hosts", Origin::parse)?);
            let denies = parsed(
                &grant.denied_outbound_hosts,
                "denied_outbound_hosts",
                Origin::parse,
            )?;
            resolve.apply(allowed_outbound_hosts, adds, denies, Permission::Outbound)?;
        }
        Permissions::Webhook { routes, .. } => {
            let checked = |r: &str| check_route(r).map(|()| r.to_string());
            let adds = parsed(&grant.routes, "routes", checked)?;
            let denies = parsed(&grant.denied_routes, "denied_routes", checked)?;
            resolve.apply(routes, adds, denies, Permission::Route)?;
        }
        Permissions::Module { reads, .. } => {
            let read = |r: &str| read_of(&name, r);
            let adds = parsed(&grant.reads, "reads", read)?;
            let denies = parsed(&grant.denied_reads, "denied_reads", read)?;
            resolve.apply(reads, adds, denies, Permission::Read)?;
        }
    }
    if let Some(bytes) = grant.max_body_bytes {
        if !(1..=MAX_GRANTED_BODY).contains(&bytes) {
            return Err((
                ".max_body_bytes".into(),
                format!("{bytes} must be between 1 and {MAX_GRANTED_BODY} (25 MiB)"),
            ));
        }
        let key = resolve.key(".max_body_bytes");
        resolve.added.push(ByOperator {
            permission: Permission::BodyLimit(bytes),
            key,
        });
        manifest.limits.max_body_bytes = bytes;
    }
    manifest.granted = Granted {
        source: source.to_string(),
        added,
        denied,
    };
    Ok(())
}

#[cfg(test)]
mod tests;
