//! The company document a node is started with (`--company`), and the one
//! acceptance rule every way in shares ([`accept`]).
//!
//! The document is validated in full before the node touches the disk; a
//! refused document stops the start with exit status 2 and every error with
//! its path. Accepting a document is parsing it *and* checking its MCP
//! servers against this node's `[mcp]` allow-list (Tier A): `--company`,
//! `PUT /config` and `crewlet config import` refuse the same documents with
//! the same sentences.

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
    pub fn load(path: &Path, policy: &CommandPolicy) -> Result<CompanyFile, CompanyError> {
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
        })).collect::<Vec<_>>(),
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
