//! The node's `shared = true` servers: one child per server name per node,
//! bound to the config epoch.
//!
//! Seats hold `Arc` handles to these children. Applying a new epoch keeps a
//! child whose launch (spec with secrets substituted) is unchanged, starts
//! the new and changed ones, and lets go of the rest: a replaced child stops
//! at once if no seat holds it, otherwise when the last seat using it lets
//! go (its client is dropped, which closes the child). A failed server is
//! retried at every apply.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crewlet_company::McpServer;
use crewlet_os::ConfigEpoch;

use crate::connection::{Connection, Launch};
use crate::status::McpStatusRow;
use crate::substitute::SubstituteError;
use crate::{McpOptions, Resolver, clip_reason};

/// The node's shared children; cheap to clone (one set per node).
#[derive(Clone)]
pub struct SharedChildren {
    inner: Arc<Inner>,
}

struct Inner {
    opts: McpOptions,
    /// One apply at a time; never held by readers.
    applying: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    epoch: Option<ConfigEpoch>,
    servers: BTreeMap<String, Shared>,
    shut_down: bool,
}

struct Shared {
    spec: McpServer,
    launch: Option<Launch>,
    slot: Result<Arc<Connection>, String>,
    /// Not started because a credential is not known yet: the next apply
    /// tries it again, even at the same epoch.
    waiting: bool,
}

impl SharedChildren {
    pub fn new(opts: McpOptions) -> SharedChildren {
        SharedChildren {
            inner: Arc::new(Inner {
                opts,
                applying: tokio::sync::Mutex::new(()),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The epoch last applied, if any.
    pub fn epoch(&self) -> Option<ConfigEpoch> {
        self.state().epoch
    }

    /// Whether a server of the applied epoch waits for a credential not
    /// known yet (apply the epoch again once it may be).
    pub fn waiting(&self) -> bool {
        self.state().servers.values().any(|s| s.waiting)
    }

    /// Why `name` was not started, when it waits for a credential not
    /// known yet.
    pub(crate) fn waits_for(&self, name: &str) -> Option<String> {
        let state = self.state();
        let shared = state.servers.get(name).filter(|s| s.waiting)?;
        shared.slot.as_ref().err().cloned()
    }

    /// Makes `servers` (the epoch's `shared = true` servers) the running set.
    /// A `shared = false` spec in `servers` is refused (recorded as failed):
    /// a template carrying a seat's credentials must never run node-wide.
    pub async fn apply(
        &self,
        epoch: ConfigEpoch,
        servers: BTreeMap<String, McpServer>,
        resolve: Resolver,
    ) {
        let _one_at_a_time = self.inner.applying.lock().await;
        if self.state().shut_down {
            tracing::warn!(
                epoch = epoch.get(),
                "shared MCP servers not applied: the node is shutting down"
            );
            return;
        }
        let starts = servers.into_iter().map(|(name, spec)| {
            let resolve = resolve.clone();
            async move {
                let shared = self.start_one(&name, spec, &resolve).await;
                (name, shared)
            }
        });
        let next: BTreeMap<String, Shared> = futures::future::join_all(starts)
            .await
            .into_iter()
            .collect();
        let swapped = {
            let mut state = self.state();
            if state.shut_down {
                Err(next)
            } else {
                state.epoch = Some(epoch);
                Ok(std::mem::replace(&mut state.servers, next))
            }
        };
        let previous = match swapped {
            Ok(previous) => previous,
            Err(unwanted) => {
                // Shut down while these started: they never serve anyone.
                stop_unused(unwanted.into_values()).await;
                return;
            }
        };
        let kept: Vec<Arc<Connection>> = self
            .state()
            .servers
            .values()
            .filter_map(|s| s.slot.as_ref().ok().cloned())
            .collect();
        let replaced: Vec<Shared> = previous
            .into_values()
            .filter(|old| match &old.slot {
                Ok(conn) => !kept.iter().any(|k| Arc::ptr_eq(k, conn)),
                Err(_) => false,
            })
            .collect();
        drop(kept);
        stop_unused(replaced.into_iter()).await;
    }

    async fn start_one(&self, name: &str, spec: McpServer, resolve: &Resolver) -> Shared {
        if !spec.shared {
            return Shared {
                spec,
                launch: None,
                slot: Err(format!(
                    "`{name}` is a per-seat template (shared = false); the node runs only shared servers"
                )),
                waiting: false,
            };
        }
        let (launch, redactor) = match Launch::resolve(&spec.transport, resolve) {
            Ok(resolved) => resolved,
            Err(e) => {
                tracing::warn!(server = name, "shared MCP server not started: {e}");
                return Shared {
                    spec,
                    launch: None,
                    waiting: matches!(e, SubstituteError::Unknown { .. }),
                    slot: Err(clip_reason(&e.to_string())),
                };
            }
        };
        let running = {
            let state = self.state();
            state
                .servers
                .get(name)
                .filter(|old| old.launch.as_ref() == Some(&launch) && old.spec == spec)
                .and_then(|old| old.slot.as_ref().ok().cloned())
        };
        if let Some(conn) = running {
            return Shared {
                spec,
                launch: Some(launch),
                slot: Ok(conn),
                waiting: false,
            };
        }
        let slot = match Connection::start(name, &launch, redactor, &self.inner.opts).await {
            Ok(conn) => {
                tracing::info!(
                    server = name,
                    tools = conn.tools.len(),
                    pid = conn.pid,
                    "shared MCP server started"
                );
                Ok(Arc::new(conn))
            }
            Err(reason) => {
                tracing::warn!(server = name, "shared MCP server failed to start: {reason}");
                Err(reason)
            }
        };
        Shared {
            spec,
            launch: Some(launch),
            slot,
            waiting: false,
        }
    }

    /// The running child for a seat whose role names `name` with `spec`.
    pub(crate) fn connection(
        &self,
        name: &str,
        spec: &McpServer,
    ) -> Result<Arc<Connection>, String> {
        let state = self.state();
        let epoch = state
            .epoch
            .map_or_else(|| "none yet".to_owned(), |e| e.to_string());
        match state.servers.get(name) {
            None => Err(format!(
                "no shared server `{name}` runs on this node (applied epoch: {epoch}); the node starts shared servers when it applies the company"
            )),
            Some(shared) if shared.spec != *spec => Err(format!(
                "the node's shared `{name}` (epoch {epoch}) has another spec than this seat's role; every role naming a shared server must give it the same spec"
            )),
            Some(shared) => shared.slot.clone(),
        }
    }

    /// One row per shared server (started 1 or failed 1).
    pub fn status(&self) -> Vec<McpStatusRow> {
        self.state()
            .servers
            .iter()
            .map(|(name, shared)| match &shared.slot {
                Ok(conn) => McpStatusRow {
                    server: name.clone(),
                    shared: true,
                    started: 1,
                    failed: 0,
                    tools: conn.tools.len() as u32,
                    last_failure: None,
                },
                Err(reason) => McpStatusRow {
                    server: name.clone(),
                    shared: true,
                    started: 0,
                    failed: 1,
                    tools: 0,
                    last_failure: Some(clip_reason(reason)),
                },
            })
            .collect()
    }

    /// The child's process id of a started shared stdio server.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.state()
            .servers
            .get(name)
            .and_then(|s| s.slot.as_ref().ok())
            .and_then(|c| c.pid)
    }

    /// Stops every shared child and waits for them to exit; seats still
    /// holding one get [`crate::McpError::ServerGone`] from then on. Later
    /// applies are refused.
    pub async fn shutdown(&self) {
        let _one_at_a_time = self.inner.applying.lock().await;
        let servers = {
            let mut state = self.state();
            state.shut_down = true;
            std::mem::take(&mut state.servers)
        };
        let stops = servers
            .into_values()
            .filter_map(|s| s.slot.ok())
            .map(|conn| async move { conn.stop().await });
        futures::future::join_all(stops).await;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Stops the children no seat holds; the others stop when their last
/// holder lets go.
async fn stop_unused(old: impl Iterator<Item = Shared>) {
    let stops = old.filter_map(|s| s.slot.ok()).filter_map(|conn| {
        // Ours is the only handle: nobody else can start using it now.
        if Arc::strong_count(&conn) == 1 {
            Some(async move { conn.stop().await })
        } else {
            None
        }
    });
    futures::future::join_all(stops).await;
}
