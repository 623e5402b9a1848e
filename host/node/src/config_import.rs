//! `crewlet config import FILE`: through a running node's `PUT /config`,
//! or, with `--data-dir` and no node holding it, into a stopped node's
//! store, published through the pointer at its next start.
//!
//! Through a running node, "activated" is not "applied": the import then
//! reads `GET /config`'s `fleet` (every node's status, aged out by the
//! broker when a node is gone) until each names the new epoch, and says
//! so; past `--wait` it names the nodes behind (exit 1). A fleet it cannot
//! read is unknown, never "applied".

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    #[error(
        "activated epoch {epoch} through {api}, but after {waited_s} s {detail}; the revision is active and the nodes behind apply it when they can (see GET /config `fleet`, and each node's /health)"
    )]
    NotApplied {
        api: String,
        epoch: u64,
        waited_s: u64,
        detail: String,
    },
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
    wait: Duration,
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
    // The node holding `data_dir` gets its own first-start token.
    let node = crate::client::NodeApi {
        api,
        data_dir: data_dir.map(PathBuf::as_path),
    };
    let (status, body) =
        crate::client::request_to(node, "PUT", "/config", &[], document.as_bytes())?;
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
    let activated = format!(
        "activated {} through {api}: epoch {}, digest {}",
        company.org, answer["epoch"], company.digest
    );
    match answer["epoch"].as_u64() {
        Some(epoch) if !wait.is_zero() => {
            let applied = wait_applied(node, epoch, wait)?;
            Ok(format!("{activated}; {applied}"))
        }
        _ => Ok(activated),
    }
}

/// How often `GET /config` is read while waiting for the fleet.
const WAIT_POLL: Duration = Duration::from_millis(250);

/// Waits until every node in `GET /config`'s `fleet` reports `epoch`
/// applied; answers who did, or [`ImportError::NotApplied`] naming who did
/// not (or why the fleet could not be read) when `wait` ran out.
fn wait_applied(
    node: crate::client::NodeApi<'_>,
    epoch: u64,
    wait: Duration,
) -> Result<String, ImportError> {
    let api = node.api;
    let started = Instant::now();
    loop {
        let seen = match crate::client::request_to(node, "GET", "/config", &[], b"") {
            Ok((200, body)) => FleetSeen::read(&body, epoch),
            Ok((status, body)) => {
                FleetSeen::Unknown(format!("GET /config answered {status}: {body}"))
            }
            Err(e) => FleetSeen::Unknown(e.to_string()),
        };
        if let FleetSeen::Superseded(active) = &seen {
            return Ok(format!(
                "superseded by epoch {active}, activated since; the fleet follows that one"
            ));
        }
        if let FleetSeen::Applied(nodes) = &seen {
            return Ok(format!(
                "applied by {} node{} ({}) in {:.1} s",
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" },
                nodes.join(", "),
                started.elapsed().as_secs_f64()
            ));
        }
        if started.elapsed() >= wait {
            return Err(ImportError::NotApplied {
                api: api.to_owned(),
                epoch,
                waited_s: wait.as_secs(),
                detail: seen.behind(),
            });
        }
        std::thread::sleep(WAIT_POLL);
    }
}

/// What `GET /config` said of the fleet and `epoch`.
enum FleetSeen {
    /// Every node listed applied it (these).
    Applied(Vec<String>),
    /// These nodes have not (node, what it reports).
    Behind {
        applied: usize,
        behind: Vec<(String, String)>,
    },
    /// A later revision was activated meanwhile (its epoch): nobody will
    /// apply this one now, so there is nothing left to wait for.
    Superseded(u64),
    /// The fleet could not be read: unknown, never "applied".
    Unknown(String),
}

impl FleetSeen {
    fn read(body: &str, epoch: u64) -> FleetSeen {
        let v: serde_json::Value = match serde_json::from_str(body) {
            Ok(v) => v,
            Err(e) => return FleetSeen::Unknown(format!("GET /config answered no JSON: {e}")),
        };
        if let Some(active) = v["epoch"].as_u64().filter(|a| *a > epoch) {
            return FleetSeen::Superseded(active);
        }
        let Some(fleet) = v["fleet"].as_array() else {
            let why = v["fleet_error"]
                .as_str()
                .unwrap_or("no `fleet` in GET /config");
            return FleetSeen::Unknown(format!("the node statuses could not be read: {why}"));
        };
        let mut applied = Vec::new();
        let mut behind = Vec::new();
        for n in fleet {
            let node = n["node"].as_str().unwrap_or("?").to_string();
            if n["applied_epoch"].as_u64() == Some(epoch) {
                applied.push(node);
            } else {
                let at = match n["applied_epoch"].as_u64() {
                    Some(e) => format!("at epoch {e}"),
                    None => "has applied no revision".to_string(),
                };
                let error = n["error"]
                    .as_str()
                    .map(|e| format!(", failing: {e}"))
                    .unwrap_or_default();
                behind.push((
                    node,
                    format!(
                        "{at} (posture {}{error})",
                        n["posture"].as_str().unwrap_or("?")
                    ),
                ));
            }
        }
        if behind.is_empty() && !applied.is_empty() {
            FleetSeen::Applied(applied)
        } else {
            FleetSeen::Behind {
                applied: applied.len(),
                behind,
            }
        }
    }

    fn behind(&self) -> String {
        match self {
            FleetSeen::Applied(nodes) => format!("{} nodes applied it", nodes.len()),
            FleetSeen::Superseded(active) => format!("epoch {active} superseded it"),
            FleetSeen::Behind { applied, behind } if behind.is_empty() => {
                format!("{applied} nodes applied it and no node has reported yet")
            }
            FleetSeen::Behind { applied, behind } => format!(
                "{applied} of {} nodes applied it: {}",
                applied + behind.len(),
                behind
                    .iter()
                    .map(|(n, what)| format!("{n} is {what}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            FleetSeen::Unknown(why) => format!("whether the fleet applied it is unknown: {why}"),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(body: serde_json::Value) -> FleetSeen {
        FleetSeen::read(&body.to_string(), 7)
    }

    fn node(id: &str, applied: u64) -> serde_json::Value {
        serde_json::json!({"node": id, "applied_epoch": applied, "posture": "serve", "error": null})
    }

    #[test]
    fn the_fleet_is_applied_only_when_every_node_says_so() {
        let all = seen(serde_json::json!({"epoch": 7, "fleet": [node("a", 7), node("b", 7)]}));
        assert!(matches!(&all, FleetSeen::Applied(n) if n == &["a", "b"]));

        let one_behind =
            seen(serde_json::json!({"epoch": 7, "fleet": [node("a", 7), node("b", 6)]}));
        assert!(matches!(&one_behind, FleetSeen::Behind { applied: 1, .. }));
        assert_eq!(
            one_behind.behind(),
            "1 of 2 nodes applied it: b is at epoch 6 (posture serve)"
        );

        let none_listed = seen(serde_json::json!({"epoch": 7, "fleet": []}));
        assert!(matches!(none_listed, FleetSeen::Behind { applied: 0, .. }));
    }

    #[test]
    fn an_unreadable_fleet_is_unknown_and_a_later_epoch_supersedes() {
        let unreadable =
            seen(serde_json::json!({"epoch": 7, "fleet": null, "fleet_error": "timed out"}));
        assert!(matches!(&unreadable, FleetSeen::Unknown(why) if why.contains("timed out")));
        assert!(matches!(
            FleetSeen::read("not json", 7),
            FleetSeen::Unknown(_)
        ));
        let later = seen(serde_json::json!({"epoch": 9, "fleet": [node("a", 9)]}));
        assert!(matches!(later, FleetSeen::Superseded(9)));
    }
}
