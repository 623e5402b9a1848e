//! The company document a node is started with (`--company`).
//!
//! The full document — roles, seats, budgets, integrations — and its
//! activation through the config plane belong to the seats issue. At this
//! stage a node reads the file, refuses one that is not a TOML document with
//! an `[org]` name, and reports what it found; nothing is activated from it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone)]
pub struct CompanyFile {
    pub path: PathBuf,
    pub org: String,
    pub seats: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum CompanyError {
    #[error("{file}: cannot read the company document: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Invalid { file: String, message: String },
}

#[derive(Deserialize)]
struct Head {
    org: Option<Org>,
    #[serde(default)]
    seats: toml::Table,
}

#[derive(Deserialize)]
struct Org {
    name: Option<String>,
}

impl CompanyFile {
    pub fn load(path: &Path) -> Result<CompanyFile, CompanyError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CompanyError::Read {
            file: file.clone(),
            source,
        })?;
        let head: Head = toml::from_str(&text).map_err(|e| CompanyError::Invalid {
            file: file.clone(),
            message: format!("not a valid company document: {}", e.to_string().trim_end()),
        })?;
        let org = head
            .org
            .and_then(|o| o.name)
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| CompanyError::Invalid {
                file: file.clone(),
                message: "key `org.name`: expected the organisation's name".into(),
            })?;
        Ok(CompanyFile {
            path: path.to_path_buf(),
            org,
            seats: head.seats.len(),
        })
    }
}
