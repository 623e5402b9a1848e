//! A module's tools: [`ModulePlugin::call_tool`].
//!
//! Rules, and why:
//! - Only a tool the manifest declares is called ([`ToolError::Unknown`]):
//!   the tools a seat sees are the manifest's, never what a guest claims.
//! - The arguments are checked against the tool's schema (compiled once,
//!   at load) before the module runs ([`ToolError::BadArguments`]), so a
//!   module never sees arguments its manifest refuses, and a model's
//!   malformed call costs no guest time.
//! - A call runs on the module's one instance under its deadline, like
//!   every other step; a fault drops the instance (the next call starts a
//!   new one). The answer, `Ok` or `Err`, is cut at
//!   [`MAX_TOOL_ANSWER_BYTES`]: it goes into a model's context.

use crate::bindings::module::exports::crewlet::plugin::handlers::{Caller, ToolCall};
use crate::runtime::CallError;

use super::ctx::naming_deny;
use super::{ModulePlugin, ModuleRefusal, StartError};

/// The longest answer (text or error) a tool call hands back, in bytes.
pub const MAX_TOOL_ANSWER_BYTES: usize = 64 * 1024;
/// The longest arguments a tool call is handed, in bytes.
pub const MAX_ARGUMENTS_BYTES: usize = 256 * 1024;

/// The seat whose turn calls a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCaller {
    /// The seat's handle.
    pub seat: String,
    pub turn_id: String,
}

/// Why a tool call did not reach the module, or did not come back.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(
        "module `{module}` has no tool `{tool}`; call one its manifest declares in [module.tools]"
    )]
    Unknown { module: String, tool: String },
    #[error(
        "module `{module}`, tool `{tool}`: the arguments do not match its schema: {reason}; call it again with arguments the schema accepts"
    )]
    BadArguments {
        module: String,
        tool: String,
        reason: String,
    },
    #[error(transparent)]
    Call(#[from] CallError),
}

/// `text` cut to at most [`MAX_TOOL_ANSWER_BYTES`], on a character
/// boundary, saying so when it was cut.
fn bounded(text: String) -> String {
    if text.len() <= MAX_TOOL_ANSWER_BYTES {
        return text;
    }
    const NOTE: &str = "\n[cut: the answer was longer than 64 KiB]";
    let mut cut = MAX_TOOL_ANSWER_BYTES - NOTE.len();
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = text;
    out.truncate(cut);
    out.push_str(NOTE);
    out
}

impl ModulePlugin {
    /// Calls `tool` with `arguments` for `caller`. `Ok(Ok(text))` is the
    /// text for the model, `Ok(Err(why))` the module's tool error (both cut
    /// at [`MAX_TOOL_ANSWER_BYTES`]); `Err` is a call that never ran or
    /// faulted.
    pub async fn call_tool(
        &self,
        tool: &str,
        arguments: &serde_json::Value,
        caller: &ToolCaller,
    ) -> Result<Result<String, ModuleRefusal>, ToolError> {
        let module = &self.shell.manifest.name;
        let bad = |reason: String| ToolError::BadArguments {
            module: module.clone(),
            tool: tool.to_string(),
            reason,
        };
        let Some(validator) = self.validators.get(tool) else {
            return Err(ToolError::Unknown {
                module: module.clone(),
                tool: tool.to_string(),
            });
        };
        // `is_valid` first: it stops at the first failure and builds no
        // errors, so the common (valid) call pays for one pass only.
        if !validator.is_valid(arguments) {
            let problems: Vec<String> = validator
                .iter_errors(arguments)
                .take(3)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    let at = if at.is_empty() { "/".to_string() } else { at };
                    format!("{at}: {e}")
                })
                .collect();
            return Err(bad(problems.join("; ")));
        }
        let arguments_json = arguments.to_string();
        if arguments_json.len() > MAX_ARGUMENTS_BYTES {
            return Err(bad(format!(
                "{} bytes, more than {MAX_ARGUMENTS_BYTES}",
                arguments_json.len()
            )));
        }

        let mut live = self.live.lock().await;
        match self.ensure_live(&mut live).await {
            Ok(()) => {}
            Err(StartError::Call(e)) => return Err(e.into()),
            Err(StartError::Refused(reason)) => return Ok(Err(ModuleRefusal::Init(reason))),
        }
        let call = ToolCall {
            name: tool.to_string(),
            arguments_json,
            caller: Caller {
                seat: caller.seat.clone(),
                turn_id: caller.turn_id.clone(),
            },
        };
        super::denied_met(&live); // a deny met between calls is not this call's
        let answer = self
            .on_live(&mut live, move |bindings, mut store| async move {
                let r = bindings
                    .crewlet_plugin_handlers()
                    .call_call_tool(&mut store, &call)
                    .await;
                (store, bindings, r)
            })
            .await?;
        let denied = super::denied_met(&live);
        Ok(answer
            .map(bounded)
            .map_err(|why| ModuleRefusal::Refused(naming_deny(bounded(why), denied))))
    }

    /// [`ModulePlugin::call_tool`] with the arguments as JSON text (a
    /// captured call, a test); text that is not JSON is refused as
    /// [`ToolError::BadArguments`] before anything else.
    pub async fn call_tool_json(
        &self,
        tool: &str,
        arguments_json: &str,
        caller: &ToolCaller,
    ) -> Result<Result<String, ModuleRefusal>, ToolError> {
        let arguments: serde_json::Value =
            serde_json::from_str(arguments_json).map_err(|e| ToolError::BadArguments {
                module: self.shell.manifest.name.clone(),
                tool: tool.to_string(),
                reason: format!("not JSON: {e}"),
            })?;
        self.call_tool(tool, &arguments, caller).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_cut_on_a_character_boundary_and_says_so() {
        let short = "ok".to_string();
        assert_eq!(bounded(short.clone()), short);
        let long = "é".repeat(MAX_TOOL_ANSWER_BYTES);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_TOOL_ANSWER_BYTES, "{}", cut.len());
        assert!(cut.ends_with("longer than 64 KiB]"));
        assert!(cut.starts_with("éé"));
    }
}
