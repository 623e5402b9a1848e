//! A served seat's tools: its own MCP children, and the tools of the
//! modules its role lists (`[roles.X] modules = [...]`).
//!
//! Both are tool servers to the turn: a module is listed beside the MCP
//! servers, `list_mcp_server_tools` shows its manifest's tools (the host
//! knows them without running the module) and `activate_tool` makes one
//! callable as `MODULE__TOOL`. A module tool's call runs under the module's
//! deadline with the seat's handle and the turn's id; arguments that do
//! not match the tool's schema are refused before the module runs, and a
//! trap, a timeout or a refusal is a tool error the model reads — never a
//! failed turn.

use std::sync::Arc;

use crewlet_mcp::{SeatTools, ServerState};
use crewlet_plugins::Installed;
use crewlet_plugins::module::{ModulePlugin, ToolCaller, ToolError};
use crewlet_turns::{ServerInfo, ToolDef, ToolOutput, Toolbox};

/// A served seat: its own tool registry and its role's modules.
pub struct Equipped {
    pub(crate) tools: SeatTools,
    /// The role's modules this node ran when the seat was equipped; each
    /// call meets the version serving now (a reload swaps it).
    pub(crate) modules: Vec<String>,
    pub(crate) installed: Arc<Installed>,
    pub(crate) seat: String,
}

impl Equipped {
    fn module(&self, name: &str) -> Option<Arc<ModulePlugin>> {
        match self.modules.iter().any(|m| m == name) {
            true => self.installed.module(name),
            false => None,
        }
    }
}

impl Toolbox for Equipped {
    fn servers(&self) -> Vec<ServerInfo> {
        let mcp = self.tools.servers().into_iter().map(|s| {
            let (tools, failed) = match s.state {
                ServerState::Started { tools } => (Some(tools as usize), None),
                ServerState::Failed { reason } => (None, Some(reason)),
            };
            ServerInfo {
                name: s.name,
                about: s.description.or(s.instructions),
                tools,
                failed,
            }
        });
        let modules = self
            .modules
            .iter()
            .filter_map(|name| self.module(name))
            .map(|m| ServerInfo {
                name: m.manifest().name.clone(),
                about: Some(format!("the {} module", m.manifest().name)),
                tools: Some(m.tools().len()),
                failed: None,
            });
        mcp.chain(modules).collect()
    }

    fn tools(&self, server: &str) -> Result<Vec<ToolDef>, String> {
        if let Some(module) = self.module(server) {
            return Ok(module
                .tools()
                .iter()
                .map(|t| ToolDef {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.arguments.clone(),
                })
                .collect());
        }
        self.tools
            .tools(server)
            .map(|list| {
                list.into_iter()
                    .map(|t| ToolDef {
                        name: t.name,
                        description: t.description.unwrap_or_default(),
                        parameters: t.input_schema,
                    })
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Value,
        turn_id: &str,
    ) -> Result<ToolOutput, String> {
        if let Some(module) = self.module(server) {
            let caller = ToolCaller {
                seat: self.seat.clone(),
                turn_id: turn_id.to_string(),
            };
            let answer = module.call_tool(tool, &arguments, &caller).await;
            return Ok(match answer {
                Ok(Ok(text)) => ToolOutput {
                    text,
                    is_error: false,
                },
                Ok(Err(refusal)) => ToolOutput {
                    text: refusal.to_string(),
                    is_error: true,
                },
                Err(e @ (ToolError::Unknown { .. } | ToolError::BadArguments { .. })) => {
                    ToolOutput {
                        text: e.to_string(),
                        is_error: true,
                    }
                }
                Err(ToolError::Call(e)) => ToolOutput {
                    text: format!("the module did not answer: {e}"),
                    is_error: true,
                },
            });
        }
        // Boxed: a module call (this future's other branch) need not
        // carry an MCP call's state.
        Box::pin(self.tools.call(server, tool, arguments))
            .await
            .map(|r| ToolOutput {
                text: r.text,
                is_error: r.is_error,
            })
            .map_err(|e| e.to_string())
    }

    fn call_detached(&self, server: &str, tool: &str, arguments: serde_json::Value, turn_id: &str) {
        let (seat, server_name, tool_name) =
            (self.seat.clone(), server.to_owned(), tool.to_owned());
        let said = move |r: Result<bool, String>| match r {
            Ok(false) => {
                tracing::info!(subsystem = "turns", %seat, server = %server_name, tool = %tool_name, "a detached tool call answered")
            }
            Ok(true) => {
                tracing::warn!(subsystem = "turns", %seat, server = %server_name, tool = %tool_name, "a detached tool call was refused")
            }
            Err(error) => {
                tracing::warn!(subsystem = "turns", %seat, server = %server_name, tool = %tool_name, %error, "a detached tool call could not be made")
            }
        };
        // A drop outside a runtime (the node's last teardown) has nowhere
        // to run the call: said, not panicked.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            said(Err("no runtime is left to run it".to_owned()));
            return;
        };
        if let Some(module) = self.module(server) {
            let caller = ToolCaller {
                seat: self.seat.clone(),
                turn_id: turn_id.to_string(),
            };
            let tool = tool.to_owned();
            runtime.spawn(async move {
                said(match module.call_tool(&tool, &arguments, &caller).await {
                    Ok(answer) => Ok(answer.is_err()),
                    Err(e) => Err(e.to_string()),
                })
            });
            return;
        }
        let call = self.tools.call_owned(server, tool, arguments);
        runtime
            .spawn(async move { said(call.await.map(|r| r.is_error).map_err(|e| e.to_string())) });
    }
}
