//! One event or one tool call through a module, offline: what `crewlet
//! plugins try` runs for a module.
//!
//! The module runs as a node would run it (its buckets issued from the
//! manifest, `init` first, the same deadline and memory cap), on state of
//! its own: every bucket of the catalogue is created empty in an in-process
//! store with the real one's semantics ([`crewlet_coord::MemoryKv`]), and
//! what the module publishes is kept, not sent. After the call the trial
//! lists what the module's own buckets hold and what it published.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_coord::bucket::Retentions;
use crewlet_coord::{MemoryKv, SystemClock};
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use crate::catalogue::Catalogue;
use crate::manifest::Manifest;
use crate::module::{ModuleBus, ModulePlugin, NotTaken, ToolCaller, ToolError, ensure_buckets};
use crate::runtime::{CallError, LoadError, Runtime};
use crate::state::{KvState, StateBackend};

/// What to run: one event or one tool call.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ModuleInput {
    /// An event of `kind` (a company event such as `turn_ended`, or
    /// `module.<name>.<topic>`) with its JSON payload.
    Event {
        kind: String,
        #[serde(default)]
        payload: Value,
    },
    /// A call of a tool the manifest declares, from `seat` in `turn_id`.
    Tool {
        name: String,
        #[serde(default)]
        arguments: Value,
        #[serde(default = "default_seat")]
        seat: String,
        #[serde(default = "default_turn")]
        turn_id: String,
    },
}

fn default_seat() -> String {
    "try".into()
}

fn default_turn() -> String {
    "try".into()
}

/// What the module answered, did and said.
#[derive(Debug)]
pub struct ModuleTrial {
    /// `Ok(text)`: a tool's answer (empty for an event); `Err(why)`: the
    /// module's own refusal, or the host's (bad arguments, unknown tool).
    pub answer: Result<String, String>,
    /// Events it published: (kind, payload as text).
    pub published: Vec<(String, String)>,
    /// Its own buckets after the call: (bucket, key, value as text).
    pub state: Vec<(String, String, String)>,
    /// Its log lines.
    pub said: Vec<String>,
}

/// Keeps what a module publishes.
#[derive(Default)]
struct Kept(Mutex<Vec<(String, String)>>);

impl ModuleBus for Kept {
    fn publish<'a>(
        &'a self,
        kind: &'a str,
        payload: Vec<u8>,
    ) -> BoxFuture<'a, Result<(), NotTaken>> {
        let text = String::from_utf8_lossy(&payload).into_owned();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((kind.to_string(), text));
        Box::pin(async { Ok(()) })
    }
}

/// Runs `input` through the module `manifest` describes; `Err` is a load
/// or a fault (the module trapped, ran past its deadline, ran out of
/// memory).
pub async fn try_module(
    runtime: &Arc<Runtime>,
    manifest: Manifest,
    catalogue: &Catalogue,
    input: ModuleInput,
) -> Result<ModuleTrial, TrialError> {
    let retentions = Retentions {
        lease_ttl: Duration::from_secs(30),
        status: Duration::from_secs(60),
        rate: Duration::from_secs(60),
    };
    let kv = Arc::new(MemoryKv::new(Arc::new(SystemClock), &retentions));
    let backend: Arc<dyn StateBackend> = Arc::new(KvState::new(kv));
    ensure_buckets(catalogue, backend.as_ref())
        .await
        .map_err(|e| {
            TrialError::Load(LoadError::Init {
                plugin: manifest.name.clone(),
                reason: e.to_string(),
            })
        })?;
    let kept = Arc::new(Kept::default());
    let name = manifest.name.clone();
    let plugin = ModulePlugin::start(runtime, manifest, catalogue, backend.clone(), kept.clone())
        .await
        .map_err(TrialError::Load)?;
    let answer = match input {
        ModuleInput::Event { kind, payload } => plugin
            .on_event(&kind, payload.to_string().as_bytes())
            .await
            .map_err(TrialError::Fault)?
            .map(|()| String::new())
            .map_err(|refused| refused.to_string()),
        ModuleInput::Tool {
            name: tool,
            arguments,
            seat,
            turn_id,
        } => match plugin
            .call_tool(&tool, &arguments, &ToolCaller { seat, turn_id })
            .await
        {
            Ok(answer) => answer.map_err(|refused| refused.to_string()),
            Err(ToolError::Call(fault)) => return Err(TrialError::Fault(fault)),
            Err(refused) => Err(refused.to_string()),
        },
    };
    let mut state = Vec::new();
    for spec in catalogue.buckets().into_iter().filter(|b| b.owner == name) {
        let keys = backend.keys(&spec.name).await.unwrap_or_default();
        for key in keys {
            if let Ok(Some(entry)) = backend.get(&spec.name, &key).await {
                let value = String::from_utf8_lossy(&entry.value).into_owned();
                state.push((spec.local.clone(), key, value));
            }
        }
    }
    let published = std::mem::take(&mut *kept.0.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(ModuleTrial {
        answer,
        published,
        state,
        said: plugin.logs(),
    })
}

/// Why a module trial did not answer.
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error("{0}")]
    Load(LoadError),
    #[error("{0}")]
    Fault(CallError),
}
