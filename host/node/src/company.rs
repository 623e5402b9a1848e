//! The company document a node is started with (`--company`), and the one
//! acceptance rule every way in shares ([`accept`]).
//!
//! The document is validated in full before the node touches the disk; a
//! refused document stops the start with exit status 2 and every error with
//! its path. Accepting a document is parsing it *and* checking its MCP
//! servers against this node's `[mcp]` allow-list (Tier A): `--company`,
//! `PUT /config` and `crewlet config import` refuse the same documents with
//! the same sentences. A node with plugins also checks every provider,
//! webhook plugin and module the document names against its catalogue
//! ([`check_catalogue`]).

use std::path::{Path, PathBuf};

use crewlet_company::{Company, Invalid};
use crewlet_config::NodeConfig;
use crewlet_mcp::CommandPolicy;

/// This node's allow-list for the programs a company may run.
pub fn policy(config: &NodeConfig) -> CommandPolicy {
    CommandPolicy::new(&config.mcp, std::env::current_exe().ok())
}

/// Parses `text` and refuses a document naming a program, argument list,
/// working directory or loader variable this node does not allow.
pub fn accept(text: &str, policy: &CommandPolicy) -> Result<Company, Invalid> {
    let company = Company::parse(text)?;
    let errors = policy.check_company(&company);
    if errors.is_empty() {
        Ok(company)
    } else {
        Err(Invalid { errors })
    }
}

#[derive(Debug, Clone)]
pub struct CompanyFile {
    pub path: PathBuf,
    pub company: Company,
    /// `--activate-company`: activated through the pointer whatever the
    /// fleet runs, not only onto an unset pointer.
    pub activate: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CompanyError {
    #[error("{file}: cannot read the company document: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {source}")]
    Invalid {
        file: String,
        #[source]
        source: crewlet_company::Invalid,
    },
}

impl CompanyFile {
    pub fn load(
        path: &Path,
        policy: &CommandPolicy,
        activate: bool,
    ) -> Result<CompanyFile, CompanyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CompanyError::Read {
            file: file.clone(),
            source,
        })?;
        let company =
            accept(&text, policy).map_err(|source| CompanyError::Invalid { file, source })?;
        Ok(CompanyFile {
            path: path.to_path_buf(),
            company,
            activate,
        })
    }
}

/// The org view of `c`: what `GET /org` answers.
pub fn org_view(c: &Company) -> serde_json::Value {
    serde_json::json!({
        "name": c.org,
        "timezone": c.timezone,
        "digest": c.digest,
        "budget": c.budget,
        "seats": c.seats.values().map(|s| serde_json::json!({
            "handle": s.handle,
            "id": s.id,
            "role": s.role,
            "group": s.group,
            "identities": s.identities,
        })).collect::<Vec<_>>(),
        "people": c.people.values().collect::<Vec<_>>(),
        "roles": c.roles.values().map(|r| serde_json::json!({
            "name": r.name,
            "executor": r.executor.iter().map(|m| format!("{}/{}", m.provider, m.model)).collect::<Vec<_>>(),
            "reviewer": format!("{}/{}", r.reviewer.provider, r.reviewer.model),
            "mcp_servers": r.mcp.keys().collect::<Vec<_>>(),
            "max_iterations": r.max_iterations,
            "max_tool_rounds": r.max_tool_rounds,
            "budget": r.budget,
        })).collect::<Vec<_>>(),
        "integrations": c.integrations.values().map(|i| serde_json::json!({
            "source": i.source,
            "plugin": i.plugin,
            "secret": i.secret.name_str(),
        })).collect::<Vec<_>>(),
        "schedules": c.schedules.values().map(|s| serde_json::json!({
            "name": s.name,
            "cron": s.cron.as_str(),
            "timezone": s.timezone,
            "seats": s.seats,
            "next": s.cron.next_after(&s.tz, jiff::Timestamp::now()).map(|t| t.to_string()),
            "deliver": s.deliver,
            "catch_up": s.catch_up,
        })).collect::<Vec<_>>(),
    })
}

/// What `company` names that `catalogue` cannot run: a provider, webhook
/// plugin or module the catalogue does not have, or has as another kind.
/// Each error carries the key's path and the names that would do.
///
/// Rule: a document is checked against the catalogue of the node it
/// reaches (`PUT /config`, `crewlet config import` through it, and
/// `--company` at start) before it is activated. Why: a name the node
/// cannot run was accepted before and then failed every turn with
/// `llm_unavailable`; refusing it up front is the only place the operator
/// still has the document in hand.
pub fn check_catalogue(
    company: &Company,
    catalogue: &crewlet_plugins::catalogue::Catalogue,
) -> Vec<crewlet_company::DocError> {
    use crewlet_plugins::manifest::Kind;
    let names_of = |kind: Kind| -> Vec<&str> {
        catalogue
            .plugins
            .iter()
            .filter(|m| m.kind == kind)
            .map(|m| m.name.as_str())
            .collect()
    };
    let mut errors = Vec::new();
    let check = |path: String, name: &str, want: Kind| -> Option<crewlet_company::DocError> {
        let found = catalogue.plugins.iter().find(|m| m.name == name);
        let message = match found {
            Some(m) if m.kind == want => return None,
            Some(m) => format!(
                "`{name}` is a {} plugin, not a {} plugin; name one of: {}",
                m.kind.world(),
                want.world(),
                listed(&names_of(want))
            ),
            None => format!(
                "this node's plugins have no {} plugin `{name}`; name one of: {} (or add the plugin to a plugins dir)",
                want.world(),
                listed(&names_of(want))
            ),
        };
        Some(crewlet_company::DocError { path, message })
    };
    for (role, r) in &company.roles {
        let entries = r
            .executor
            .iter()
            .enumerate()
            .map(|(i, e)| (format!("roles.{role}.executor[{i}]"), e))
            .chain([(format!("roles.{role}.reviewer"), &r.reviewer)]);
        for (at, entry) in entries {
            errors.extend(check(
                format!("{at}.provider"),
                &entry.provider,
                Kind::Provider,
            ));
            errors.extend(unknown_options(&at, entry, catalogue));
        }
        for (i, module) in r.modules.iter().enumerate() {
            errors.extend(check(
                format!("roles.{role}.modules[{i}]"),
                module,
                Kind::Module,
            ));
        }
    }
    if let Some(entry) = &company.embedding {
        let at = "memory.embedding";
        errors.extend(check(
            format!("{at}.provider"),
            &entry.provider,
            Kind::Provider,
        ));
        errors.extend(unknown_options(at, entry, catalogue));
    }
    for (key, integration) in &company.integrations {
        errors.extend(check(
            format!("integrations.{key}.plugin"),
            &integration.plugin,
            Kind::Webhook,
        ));
    }
    errors
}

/// `company` when `catalogue` can run it ([`check_catalogue`]); without a
/// catalogue (a node with no plugins) there is nothing to check against.
pub fn runnable(
    company: Company,
    catalogue: Option<&crewlet_plugins::catalogue::Catalogue>,
) -> Result<Company, Invalid> {
    let errors = catalogue.map_or_else(Vec::new, |c| check_catalogue(&company, c));
    if errors.is_empty() {
        Ok(company)
    } else {
        Err(Invalid { errors })
    }
}

/// A model entry's options its provider does not read (its manifest's
/// `[provider] options`): each refused at its own key, never ignored.
fn unknown_options(
    at: &str,
    entry: &crewlet_company::ModelRef,
    catalogue: &crewlet_plugins::catalogue::Catalogue,
) -> Vec<crewlet_company::DocError> {
    use crewlet_plugins::manifest::Permissions;
    let Some(Permissions::Provider { options, .. }) = catalogue
        .plugins
        .iter()
        .find(|m| m.name == entry.provider)
        .map(|m| &m.permissions)
    else {
        return Vec::new();
    };
    let takes = if options.is_empty() {
        "it takes none".to_string()
    } else {
        format!(
            "it takes: {}",
            listed(&options.iter().map(String::as_str).collect::<Vec<_>>())
        )
    };
    entry
        .options
        .keys()
        .filter(|k| !options.contains(k))
        .map(|k| crewlet_company::DocError {
            path: format!("{at}.options.{k}"),
            message: format!(
                "provider `{}` does not read the option `{k}` ({takes}); remove it (a provider's base URL and hosts are its plugin.toml's `[provider]`, or granted by the operator in the node's configuration: `[plugins.grants.{}] base_url = …`)",
                entry.provider, entry.provider
            ),
        })
        .collect()
}

fn listed(names: &[&str]) -> String {
    if names.is_empty() {
        "none are loaded".to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
