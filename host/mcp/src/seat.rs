//! A seat's own tool registry: its servers by name, each started or failed.
//!
//! Built once per claimed seat and dropped (after [`SeatTools::shutdown`])
//! when the seat's lease goes. It owns its `shared = false` children, so two
//! seats of one template can never reach each other's; it holds only a
//! reference to the node's `shared = true` children.
//!
//! A credential that is not known yet (the secrets store has not answered)
//! is no failure to run without: [`SeatTools::start`] spawns nothing and
//! answers [`CredentialUnknown`], and the caller equips the seat again later.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crewlet_company::McpServer;

use crate::connection::{Connection, Launch};
use crate::shared::SharedChildren;
use crate::status::McpStatusRow;
use crate::substitute::{Redactor, SubstituteError};
use crate::{
    McpError, McpOptions, Resolver, ServerState, ServerSummary, ToolResult, ToolSpec, clip_reason,
};

enum Slot {
    Started(Arc<Connection>),
    Failed(String),
}

struct Entry {
    shared: bool,
    slot: Slot,
}

/// A server of the seat waits for a credential not known yet: nothing was
/// started; equip the seat again once the secrets store answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MCP server `{server}` waits for its credential, so the seat is not equipped yet: {why}")]
pub struct CredentialUnknown {
    pub server: String,
    pub why: String,
}

/// One seat's MCP servers.
pub struct SeatTools {
    seat: String,
    servers: BTreeMap<String, Entry>,
    call_timeout: Duration,
}

impl SeatTools {
    /// Starts the seat's servers concurrently, each within
    /// `opts.start_timeout`. A server that cannot start is recorded as
    /// failed with its reason and the seat runs with the others — except
    /// one whose credential is not known yet: then nothing is started and
    /// the answer is [`CredentialUnknown`].
    pub async fn start(
        seat: &str,
        servers: &BTreeMap<String, McpServer>,
        shared: &SharedChildren,
        resolve: Resolver,
        opts: &McpOptions,
    ) -> Result<SeatTools, CredentialUnknown> {
        // Every launch resolved before any child is spawned.
        let mut launches = BTreeMap::new();
        for (name, spec) in servers {
            if spec.shared {
                if let Some(why) = shared.waits_for(name) {
                    return Err(CredentialUnknown {
                        server: name.clone(),
                        why,
                    });
                }
                continue;
            }
            match Launch::resolve(&spec.transport, &resolve) {
                Err(e @ SubstituteError::Unknown { .. }) => {
                    return Err(CredentialUnknown {
                        server: name.clone(),
                        why: e.to_string(),
                    });
                }
                resolved => {
                    launches.insert(name.clone(), resolved);
                }
            }
        }
        let starts = servers.iter().map(|(name, spec)| {
            let resolved = launches.remove(name);
            async move {
                let slot = match resolved {
                    None => match shared.connection(name, spec) {
                        Ok(conn) => Slot::Started(conn),
                        Err(reason) => Slot::Failed(reason),
                    },
                    Some(resolved) => start_own(seat, name, resolved, opts).await,
                };
                (
                    name.clone(),
                    Entry {
                        shared: spec.shared,
                        slot,
                    },
                )
            }
        });
        let servers = futures::future::join_all(starts)
            .await
            .into_iter()
            .collect();
        Ok(SeatTools {
            seat: seat.to_owned(),
            servers,
            call_timeout: opts.call_timeout,
        })
    }

    /// The seat this registry belongs to.
    pub fn seat(&self) -> &str {
        &self.seat
    }

    /// Every server, started or failed, by name.
    pub fn servers(&self) -> Vec<ServerSummary> {
        self.servers
            .iter()
            .map(|(name, entry)| match &entry.slot {
                Slot::Started(conn) => ServerSummary {
                    name: name.clone(),
                    shared: entry.shared,
                    state: ServerState::Started {
                        tools: conn.tools.len() as u32,
                    },
                    description: conn.description.clone(),
                    instructions: conn.instructions.clone(),
                    pid: conn.pid,
                },
                Slot::Failed(reason) => ServerSummary {
                    name: name.clone(),
                    shared: entry.shared,
                    state: ServerState::Failed {
                        reason: reason.clone(),
                    },
                    description: None,
                    instructions: None,
                    pid: None,
                },
            })
            .collect()
    }

    /// The tools `server` listed at start.
    pub fn tools(&self, server: &str) -> Result<Vec<ToolSpec>, McpError> {
        Ok(self.started(server)?.tools.clone())
    }

    /// Every tool of every started server.
    pub fn all_tools(&self) -> Vec<ToolSpec> {
        self.servers
            .values()
            .filter_map(|e| match &e.slot {
                Slot::Started(conn) => Some(conn.tools.iter().cloned()),
                Slot::Failed(_) => None,
            })
            .flatten()
            .collect()
    }

    /// Calls `tool` on `server` with `arguments` (a JSON object, or `null`
    /// for none), bounded by the call timeout.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Value,
    ) -> Result<ToolResult, McpError> {
        let (conn, arguments) = self.prepare(server, tool, arguments)?;
        conn.call(tool, arguments, self.call_timeout).await
    }

    /// [`SeatTools::call`] as a future owning what it needs, for a call
    /// that must outlive its caller (a dropped turn's working indicator,
    /// cleared on a task of its own).
    pub fn call_owned(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Value,
    ) -> impl std::future::Future<Output = Result<ToolResult, McpError>> + Send + 'static {
        let prepared = self.prepare(server, tool, arguments);
        let (tool, timeout) = (tool.to_owned(), self.call_timeout);
        async move {
            let (conn, arguments) = prepared?;
            conn.call(&tool, arguments, timeout).await
        }
    }

    /// The connection a call goes to and its arguments as an object.
    fn prepare(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Value,
    ) -> Result<(Arc<Connection>, serde_json::Map<String, serde_json::Value>), McpError> {
        let conn = self.started(server)?;
        if !conn.tools.iter().any(|t| t.name == tool) {
            return Err(McpError::UnknownTool {
                server: server.to_owned(),
                tool: tool.to_owned(),
            });
        }
        let arguments = match arguments {
            serde_json::Value::Object(map) => map,
            serde_json::Value::Null => serde_json::Map::new(),
            other => {
                return Err(McpError::BadArguments {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    got: json_kind(&other),
                });
            }
        };
        Ok((conn.clone(), arguments))
    }

    /// One row per server, for the node's presence (see [`crate::merge_status`]).
    pub fn status(&self) -> Vec<McpStatusRow> {
        self.servers
            .iter()
            .map(|(name, entry)| match &entry.slot {
                Slot::Started(conn) => McpStatusRow {
                    server: name.clone(),
                    shared: entry.shared,
                    started: 1,
                    failed: 0,
                    tools: conn.tools.len() as u32,
                    last_failure: None,
                },
                Slot::Failed(reason) => McpStatusRow {
                    server: name.clone(),
                    shared: entry.shared,
                    started: 0,
                    failed: 1,
                    tools: 0,
                    last_failure: Some(clip_reason(reason)),
                },
            })
            .collect()
    }

    /// Stops this seat's own children and waits for them to exit; lets go
    /// of the shared ones (the node stops those).
    pub async fn shutdown(self) {
        let stops = self.servers.into_values().filter_map(|e| match e.slot {
            Slot::Started(conn) if !e.shared => Some(async move { conn.stop().await }),
            _ => None,
        });
        futures::future::join_all(stops).await;
    }

    fn started(&self, server: &str) -> Result<&Arc<Connection>, McpError> {
        match self.servers.get(server).map(|e| &e.slot) {
            Some(Slot::Started(conn)) => Ok(conn),
            Some(Slot::Failed(reason)) => Err(McpError::NotStarted {
                server: server.to_owned(),
                reason: reason.clone(),
            }),
            None => Err(McpError::UnknownServer {
                server: server.to_owned(),
                known: if self.servers.is_empty() {
                    "no servers".to_owned()
                } else {
                    self.servers.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            }),
        }
    }
}

async fn start_own(
    seat: &str,
    name: &str,
    resolved: Result<(Launch, Redactor), SubstituteError>,
    opts: &McpOptions,
) -> Slot {
    let (launch, redactor) = match resolved {
        Ok(resolved) => resolved,
        Err(e) => {
            tracing::warn!(seat, server = name, "MCP server not started: {e}");
            return Slot::Failed(clip_reason(&e.to_string()));
        }
    };
    match Connection::start(name, &launch, redactor, opts).await {
        Ok(conn) => {
            tracing::info!(
                seat,
                server = name,
                tools = conn.tools.len(),
                pid = conn.pid,
                "MCP server started"
            );
            Slot::Started(Arc::new(conn))
        }
        Err(reason) => {
            tracing::warn!(seat, server = name, "MCP server failed to start: {reason}");
            Slot::Failed(reason)
        }
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
