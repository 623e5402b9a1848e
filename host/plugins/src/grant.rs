//! Operator grants: what a deployment adds to a plugin's manifest.
//!
//! Rules, and why:
//! - **Declare ∩ grant, widened only by the operator.** A manifest says
//!   what its author's plugin needs anywhere; the node's configuration
//!   (`[plugins.grants.NAME]`) says what this deployment adds — a
//!   provider's base URL (a proxy, a self-hosted server) and the outbound
//!   hosts that go with it, a webhook plugin's body limit. Nothing a
//!   plugin ships can widen what it gets; an operator's grant is explicit
//!   and named.
//! - **Resolved once, at load, into the manifest the runtime enforces**, so
//!   the one choke point that checks a call (the outbound policy, the
//!   edge's body cap) never learns there are two sources. Each item keeps
//!   where it came from ([`Granted`]), for `plugins list` and `GET
//!   /plugins`.
//! - **Refused with the key's path** (`plugins.grants.openai.base_url`):
//!   a grant for a plugin the catalogue does not have, of a kind the
//!   plugin is not, or a URL that is not `http(s)://host[:port]`, stops
//!   the start before anything runs.

use std::collections::BTreeMap;

use crate::catalogue::Catalogue;
use crate::manifest::{Granted, Kind, MAX_GRANTED_BODY, Manifest, Origin, Permissions};

/// One plugin's grant as the configuration states it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    /// A provider's base URL, replacing its manifest's; its origin is
    /// granted with it.
    pub base_url: Option<String>,
    /// More origins a provider may reach.
    pub allowed_outbound_hosts: Vec<String>,
    /// A webhook plugin's body limit.
    pub max_body_bytes: Option<u64>,
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
    /// manifests they name; the first that is wrong is refused whole.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use std::path::Path;
    /// use crewlet_plugins::Catalogue;
    /// use crewlet_plugins::grant::Grant;
    /// use crewlet_plugins::manifest::Manifest;
    ///
    /// let openai = Manifest::parse(
    ///     Path::new("plugins/openai/plugin.toml"),
    ///     r#"name = "openai"
    ///        version = "1.0.0"
    ///        kind = "provider"
    ///        component = "openai.wasm"
    ///        [provider]
    ///        base_url = "https://api.openai.com/v1"
    ///        allowed_outbound_hosts = ["https://api.openai.com"]"#,
    /// )?;
    /// let mut catalogue = Catalogue { plugins: vec![openai] };
    ///
    /// // The operator points the provider at a local proxy: its origin comes
    /// // with the URL, marked as the operator's, not the manifest's.
    /// let proxy = Grant { base_url: Some("http://127.0.0.1:4000/v1".into()), ..Grant::default() };
    /// let grants = BTreeMap::from([("openai".to_string(), proxy)]);
    /// catalogue.apply_grants(&grants, "node.toml")?;
    /// let granted = &catalogue.plugins[0].granted;
    /// assert_eq!(granted.base_url.as_deref(), Some("http://127.0.0.1:4000/v1"));
    /// assert_eq!(granted.outbound[0].to_string(), "http://127.0.0.1:4000");
    ///
    /// // A grant for a plugin the dirs do not hold is refused, naming its key.
    /// let typo = BTreeMap::from([("opnai".to_string(), Grant::default())]);
    /// let refused = catalogue.apply_grants(&typo, "node.toml").unwrap_err();
    /// assert!(refused.to_string().starts_with("node.toml: `plugins.grants.opnai`: "));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
            apply(manifest, grant, source).map_err(|(field, problem)| refuse(&field, problem))?;
        }
        Ok(())
    }
}

fn apply(manifest: &mut Manifest, grant: &Grant, source: &str) -> Result<(), (String, String)> {
    let mut granted = Granted {
        source: source.to_string(),
        ..Granted::default()
    };
    let kind = manifest.kind;
    let only = |field: &str, wanted: Kind| {
        (
            format!(".{field}"),
            format!(
                "only a {} plugin takes it, and `{}` is a {} plugin",
                wanted.world(),
                manifest.name,
                kind.world()
            ),
        )
    };
    if let Some(bytes) = grant.max_body_bytes {
        if kind != Kind::Webhook {
            return Err(only("max_body_bytes", Kind::Webhook));
        }
        if !(1..=MAX_GRANTED_BODY).contains(&bytes) {
            return Err((
                ".max_body_bytes".into(),
                format!("{bytes} must be between 1 and {MAX_GRANTED_BODY} (25 MiB)"),
            ));
        }
        granted.max_body_bytes = Some(bytes);
    }
    let provider_keys = grant.base_url.is_some() || !grant.allowed_outbound_hosts.is_empty();
    if provider_keys {
        let field = if grant.base_url.is_some() {
            "base_url"
        } else {
            "allowed_outbound_hosts"
        };
        let Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } = &mut manifest.permissions
        else {
            return Err(only(field, Kind::Provider));
        };
        let mut add = Vec::new();
        if let Some(url) = &grant.base_url {
            let origin = Origin::parse(url).map_err(|p| (".base_url".to_string(), p))?;
            *base_url = url.trim_end_matches('/').to_string();
            granted.base_url = Some(base_url.clone());
            add.push(origin);
        }
        for (i, host) in grant.allowed_outbound_hosts.iter().enumerate() {
            let origin =
                Origin::parse(host).map_err(|p| (format!(".allowed_outbound_hosts[{i}]"), p))?;
            add.push(origin);
        }
        for origin in add {
            if !allowed_outbound_hosts.contains(&origin) {
                allowed_outbound_hosts.push(origin.clone());
                granted.outbound.push(origin);
            }
        }
    }
    if let Some(bytes) = granted.max_body_bytes {
        manifest.limits.max_body_bytes = bytes;
    }
    manifest.granted = granted;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::DEFAULT_MAX_BODY;
    use std::path::Path;

    fn catalogue() -> Catalogue {
        let provider = Manifest::parse(
            Path::new("/p/openai/plugin.toml"),
            "name = \"openai\"\nversion = \"1.0.0\"\nkind = \"provider\"\ncomponent = \"c.wasm\"\n\
             [provider]\nbase_url = \"https://api.openai.com/v1\"\n\
             allowed_outbound_hosts = [\"https://api.openai.com\"]\n",
        )
        .unwrap();
        let webhook = Manifest::parse(
            Path::new("/p/hook/plugin.toml"),
            "name = \"hook\"\nversion = \"1.0.0\"\nkind = \"webhook\"\ncomponent = \"c.wasm\"\n\
             [webhook]\nroutes = [\"/webhooks/hook\"]\n",
        )
        .unwrap();
        Catalogue {
            plugins: vec![provider, webhook],
        }
    }

    fn grants(name: &str, grant: Grant) -> BTreeMap<String, Grant> {
        BTreeMap::from([(name.to_string(), grant)])
    }

    #[test]
    fn a_base_url_grant_moves_the_provider_and_brings_its_origin() {
        let mut c = catalogue();
        let grant = Grant {
            base_url: Some("http://127.0.0.1:4000/v1/".into()),
            allowed_outbound_hosts: vec![
                "http://127.0.0.1:4000".into(),
                "https://api.openai.com".into(),
                "https://auth.example.com".into(),
            ],
            ..Grant::default()
        };
        c.apply_grants(&grants("openai", grant), "node.toml")
            .unwrap();
        let m = &c.plugins[0];
        let Permissions::Provider {
            base_url,
            allowed_outbound_hosts,
            ..
        } = &m.permissions
        else {
            panic!("a provider")
        };
        assert_eq!(base_url, "http://127.0.0.1:4000/v1");
        let hosts: Vec<String> = allowed_outbound_hosts
            .iter()
            .map(|o| o.to_string())
            .collect();
        assert_eq!(
            hosts,
            [
                "https://api.openai.com:443",
                "http://127.0.0.1:4000",
                "https://auth.example.com:443"
            ]
        );
        // Only what the operator added is marked as theirs.
        let granted: Vec<String> = m.granted.outbound.iter().map(|o| o.to_string()).collect();
        assert_eq!(
            granted,
            ["http://127.0.0.1:4000", "https://auth.example.com:443"]
        );
        assert_eq!(m.granted.to_string(), "operator grant in node.toml");
    }

    #[test]
    fn a_wrong_grant_is_refused_with_its_key() {
        let cases = [
            (
                "opnai",
                Grant {
                    base_url: Some("http://x".into()),
                    ..Grant::default()
                },
                "node.toml: `plugins.grants.opnai`: no plugin of that name",
            ),
            (
                "openai",
                Grant {
                    base_url: Some("ftp://x".into()),
                    ..Grant::default()
                },
                "`plugins.grants.openai.base_url`: `ftp://x`: the scheme must be http or https",
            ),
            (
                "openai",
                Grant {
                    allowed_outbound_hosts: vec!["https://ok.example".into(), "https://*.x".into()],
                    ..Grant::default()
                },
                "`plugins.grants.openai.allowed_outbound_hosts[1]`: `https://*.x`: a host is required and wildcards are not allowed",
            ),
            (
                "openai",
                Grant {
                    max_body_bytes: Some(10),
                    ..Grant::default()
                },
                "`plugins.grants.openai.max_body_bytes`: only a webhook plugin takes it",
            ),
            (
                "hook",
                Grant {
                    base_url: Some("http://x".into()),
                    ..Grant::default()
                },
                "`plugins.grants.hook.base_url`: only a provider plugin takes it",
            ),
            (
                "hook",
                Grant {
                    max_body_bytes: Some(MAX_GRANTED_BODY + 1),
                    ..Grant::default()
                },
                "`plugins.grants.hook.max_body_bytes`: 26214401 must be between 1 and",
            ),
        ];
        for (name, grant, says) in cases {
            let mut c = catalogue();
            let e = c
                .apply_grants(&grants(name, grant), "node.toml")
                .unwrap_err();
            assert!(e.to_string().contains(says), "{e} ≠ {says}");
            assert!(c.plugins.iter().all(|m| m.granted.is_empty()));
        }
    }

    #[test]
    fn a_body_grant_raises_only_that_webhook_route() {
        let mut c = catalogue();
        let grant = Grant {
            max_body_bytes: Some(8 * 1024 * 1024),
            ..Grant::default()
        };
        c.apply_grants(&grants("hook", grant), "node.toml").unwrap();
        assert_eq!(c.plugins[1].limits.max_body_bytes, 8 * 1024 * 1024);
        assert_eq!(c.plugins[0].limits.max_body_bytes, DEFAULT_MAX_BODY);
    }
}
