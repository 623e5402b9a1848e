//! `read_thread`, `raise_working`, `clear_working`, `notice` and `sources` of a role's
//! MCP server, as written (see [`crate::surface`]).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Errors, non_empty};
use crate::surface::{SurfaceTool, SurfaceTools, default_arguments, notice_arguments};

/// One mapping as written: `false`, a tool name, or `{ tool, arguments }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawSurfaceTool {
    Switch(bool),
    Name(String),
    Call(RawCall),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCall {
    tool: String,
    arguments: Option<BTreeMap<String, toml::Value>>,
}

/// Validates the mappings of the server at `path`.
pub(super) fn validate(
    path: &str,
    read_thread: Option<RawSurfaceTool>,
    raise_working: Option<RawSurfaceTool>,
    clear_working: Option<RawSurfaceTool>,
    notice: Option<RawSurfaceTool>,
    sources: Vec<String>,
    errors: &mut Errors,
) -> SurfaceTools {
    let mut one = |key: &str, raw: Option<RawSurfaceTool>| {
        let defaults = match key {
            "notice" => notice_arguments,
            _ => default_arguments,
        };
        let at = format!("{path}.{key}");
        match raw {
            None => SurfaceTool::ByName,
            Some(RawSurfaceTool::Switch(false)) => SurfaceTool::Off,
            Some(RawSurfaceTool::Switch(true)) => {
                errors.add(at, "expected a tool name, `{ tool = \"…\", arguments = { … } }` or `false`; `true` names no tool (leave the key out to use the server's own `read_thread` / `raise_working` / `clear_working`, or its first reply tool for `notice`)");
                SurfaceTool::Off
            }
            Some(RawSurfaceTool::Name(tool)) => call(&at, tool, None, defaults, errors),
            Some(RawSurfaceTool::Call(RawCall { tool, arguments })) => {
                call(&format!("{at}.tool"), tool, arguments, defaults, errors)
            }
        }
    };
    let tools = SurfaceTools {
        read_thread: one("read_thread", read_thread),
        raise_working: one("raise_working", raise_working),
        clear_working: one("clear_working", clear_working),
        notice: one("notice", notice),
        sources,
    };
    for (i, source) in tools.sources.iter().enumerate() {
        errors.check(
            format!("{path}.sources[{i}]"),
            non_empty(source, "a webhook source"),
        );
    }
    tools
}

fn call(
    at: &str,
    tool: String,
    arguments: Option<BTreeMap<String, toml::Value>>,
    defaults: fn() -> BTreeMap<String, serde_json::Value>,
    errors: &mut Errors,
) -> SurfaceTool {
    errors.check(at, non_empty(&tool, "a tool name"));
    let arguments = match arguments {
        None => defaults(),
        Some(args) => args
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    serde_json::to_value(v).unwrap_or(serde_json::Value::Null),
                )
            })
            .collect(),
    };
    SurfaceTool::Tool { tool, arguments }
}
