//! An operator's read of a module bucket (what
//! `GET /plugins/{name}/state/{bucket}` answers; the route is
//! `crewlet-api`'s): its current keys and values, read-only. `bucket` is
//! the module's own local name for a bucket it owns. Values are shown as
//! JSON when they are JSON, else as text; no value holds a credential
//! (ADR 202: the host refuses credential-named fields at put). At most
//! [`MAX_KEYS`] keys are answered, and the answer says so when it holds
//! fewer than the bucket.

use serde_json::{Value, json};

use crate::Installed;
use crate::manifest::{Permissions, bucket_name};
use crate::state::StateBackend;

/// The most keys one answer lists.
pub const MAX_KEYS: usize = 1000;

/// Why a bucket was not read (the text says what to do).
#[derive(Debug, thiserror::Error)]
pub enum StateReadError {
    /// No such module here, or no such bucket of it.
    #[error("{0}")]
    NotFound(String),
    /// The bucket cannot be read now.
    #[error("{0}")]
    Unavailable(String),
}

/// Module `name`'s bucket `bucket`, as the module docs describe.
pub async fn read_bucket(
    installed: &Installed,
    state: &dyn StateBackend,
    name: &str,
    bucket: &str,
) -> Result<Value, StateReadError> {
    let module = installed
        .module(name)
        .ok_or_else(|| StateReadError::NotFound(format!("no module {name:?} runs on this node")))?;
    let owns = match &module.manifest().permissions {
        Permissions::Module { state, .. } => state.iter().any(|b| b.local == bucket),
        _ => false,
    };
    if !owns {
        return Err(StateReadError::NotFound(format!(
            "module {name:?} owns no bucket {bucket:?} (its manifest's [module.state.*])"
        )));
    }
    let mesh = bucket_name(name, bucket);
    let unavailable = |e: String| StateReadError::Unavailable(e);
    let keys = state
        .keys(&mesh)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    let total = keys.len();
    let mut entries = Vec::new();
    for key in keys.into_iter().take(MAX_KEYS) {
        match state.get(&mesh, &key).await {
            Ok(Some(e)) => entries.push(json!({
                "key": e.key,
                "revision": e.revision,
                "value": shown(&e.value),
            })),
            Ok(None) => {} // deleted since the listing
            Err(e) => return Err(unavailable(e.to_string())),
        }
    }
    Ok(json!({
        "module": name,
        "bucket": bucket,
        "keys": total,
        "entries": entries,
        "limit": MAX_KEYS,
        "truncated": total > MAX_KEYS,
    }))
}

fn shown(value: &[u8]) -> Value {
    serde_json::from_slice(value)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(value).into_owned()))
}
