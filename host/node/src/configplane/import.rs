//! `crewlet config import FILE`: through a running node's `PUT /config`,
//! or, with `--data-dir` and no node holding it, into a stopped node's
//! store, published through the pointer at its next start.

use std::path::{Path, PathBuf};

use crewlet_company::Company;

use crate::client::ClientError;

/// Why `crewlet config import` did not import.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
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
    #[error("{0}{hint}", hint = .0.offline_hint())]
    Client(#[from] ClientError),
    #[error("the node at {api} answered {status}: {body}")]
    Refused {
        api: String,
        status: u16,
        body: String,
    },
    #[error("--data-dir {0}: no such directory; pass the data dir the node runs with")]
    NoDataDir(String),
    #[error(transparent)]
    Lock(crewlet_stream::LockError),
    #[error(transparent)]
    Store(#[from] crewlet_store::StoreError),
}

impl ImportError {
    /// The process exit status: 2 for a document refused, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            ImportError::Invalid { .. } => 2,
            ImportError::Refused { status: 400, .. } => 2,
            _ => 1,
        }
    }
}

/// `crewlet config import FILE`: through a running node's `PUT /config`;
/// with `data_dir` and no node holding it, marks the revision active in the
/// node store so the next start publishes it. Answers what was done.
///
/// A document is checked against the allow-list of the node that will run
/// it: the running node's own (its `PUT /config` refuses), or for a stopped
/// node the `[mcp]` of `node_config` (the file that node starts with).
pub fn import(
    file: &Path,
    api: &str,
    data_dir: Option<&PathBuf>,
    node_config: &crewlet_config::NodeConfig,
) -> Result<String, ImportError> {
    let label = file.display().to_string();
    let document = std::fs::read_to_string(file).map_err(|source| ImportError::Read {
        file: label.clone(),
        source,
    })?;
    let company = Company::parse(&document).map_err(|source| ImportError::Invalid {
        file: label.clone(),
        source,
    })?;
    if let Some(dir) = data_dir {
        if !dir.is_dir() {
            return Err(ImportError::NoDataDir(dir.display().to_string()));
        }
        let owner = format!("crewlet config import {label}");
        match crewlet_stream::DirLock::acquire(dir, ".crewlet-node.lock", "data dir", &owner) {
            Ok(_lock) => {
                let policy = crate::company::policy(node_config);
                crate::company::accept(&document, &policy).map_err(|source| {
                    ImportError::Invalid {
                        file: label.clone(),
                        source,
                    }
                })?;
                let store = crewlet_store::Store::open_in(dir)?;
                let revision = store.import_pending(&company.digest, &document, Some(&owner))?;
                return Ok(format!(
                    "no node is running on {}: marked revision {} (digest {}) active in its node store (local revision {revision}); the node activates it through the config pointer when it starts",
                    dir.display(),
                    company.org,
                    company.digest
                ));
            }
            Err(crewlet_stream::LockError::Held { .. }) => {}
            Err(e) => return Err(ImportError::Lock(e)),
        }
    }
    let (status, body) = crate::client::request(api, "PUT", "/config", &[], document.as_bytes())?;
    if status == 400
        && let Some(invalid) = refused_document(&body)
    {
        return Err(ImportError::Invalid {
            file: label,
            source: invalid,
        });
    }
    if !(200..300).contains(&status) {
        return Err(ImportError::Refused {
            api: api.to_owned(),
            status,
            body,
        });
    }
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    Ok(format!(
        "activated {} through {api}: epoch {}, digest {}",
        company.org, answer["epoch"], company.digest
    ))
}

/// The errors of a `PUT /config` 400, as the document's own refusal.
fn refused_document(body: &str) -> Option<crewlet_company::Invalid> {
    #[derive(serde::Deserialize)]
    struct Refusal {
        errors: Vec<crewlet_company::DocError>,
    }
    let r: Refusal = serde_json::from_str(body).ok()?;
    (!r.errors.is_empty()).then_some(crewlet_company::Invalid { errors: r.errors })
}
