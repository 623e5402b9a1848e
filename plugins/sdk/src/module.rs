//! The `module` world: state, logging and bus imports, handler exports,
//! and the helpers every module would otherwise write again — publishing a
//! value as JSON ([`publish`]), reading an event's JSON ([`event_json`]),
//! and dispatching tool calls by name ([`Tools`]).

wit_bindgen::generate!({
    world: "module",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "export_module",
    default_bindings_module: "crewlet_plugin_sdk::module",
});

pub use crewlet::plugin::bus::{self, PublishError};
pub use crewlet::plugin::log;
pub use crewlet::plugin::state::{self, Entry, StateError};
pub use exports::crewlet::plugin::handlers::{
    Caller, Event, Guest, StateChange, StateEvent, ToolCall,
};

/// A refusal in words: `<kind>: <detail>`, the kind being the WIT case.
pub fn describe(error: &StateError) -> String {
    match error {
        StateError::NotIssued(b) => {
            format!("not-issued: bucket `{b}` was not issued to this module")
        }
        StateError::ReadOnly(b) => format!("read-only: bucket `{b}` is read-only for this module"),
        StateError::CredentialField(p) => {
            format!("credential-field: field `{p}` names a credential")
        }
        StateError::ValueTooLarge(n) => format!("value-too-large: {n} bytes (max 262144)"),
        StateError::BucketFull(b) => format!("bucket-full: bucket `{b}` is at its cap"),
        StateError::InvalidKey(k) => format!("invalid-key: `{k}`"),
        StateError::Unavailable(r) => format!("unavailable: {r}"),
    }
}

/// A publish refusal in words: `<kind>: <detail>`, the kind being the WIT
/// case.
pub fn describe_publish(error: &PublishError) -> String {
    match error {
        PublishError::Undeclared(t) => {
            format!("undeclared: topic `{t}` is not in this module's `publishes`")
        }
        PublishError::TooLarge(n) => format!("too-large: {n} bytes (max 262144)"),
        PublishError::Unavailable(r) => format!("unavailable: {r}"),
    }
}

/// Publishes raw bytes on the local `topic` (seen by others as
/// `module.<this module>.<topic>`).
pub fn publish_bytes(topic: &str, payload: &[u8]) -> Result<(), PublishError> {
    bus::publish(topic, payload)
}

/// Publishes `value` as JSON on the local `topic`; a refusal in words
/// ([`describe_publish`]).
pub fn publish<T: serde::Serialize + ?Sized>(topic: &str, value: &T) -> Result<(), String> {
    let payload = serde_json::to_vec(value).map_err(|e| format!("cannot encode: {e}"))?;
    publish_bytes(topic, &payload).map_err(|e| describe_publish(&e))
}

/// An event's payload as JSON (every event the host delivers is JSON).
pub fn event_json(event: &Event) -> Result<serde_json::Value, String> {
    serde_json::from_slice(&event.payload)
        .map_err(|e| format!("event `{}`: the payload is not JSON: {e}", event.topic))
}

/// One tool: its arguments (already checked against the manifest's
/// schema by the host) to the text for the model, or a tool error.
pub type ToolFn = fn(serde_json::Value) -> Result<String, String>;

/// A module's tools by name, for `call-tool`:
///
/// ```ignore
/// const TOOLS: Tools = Tools::new(&[("add-note", add_note)]);
/// fn call_tool(call: ToolCall) -> Result<String, String> { TOOLS.dispatch(&call) }
/// ```
pub struct Tools {
    tools: &'static [(&'static str, ToolFn)],
}

impl Tools {
    pub const fn new(tools: &'static [(&'static str, ToolFn)]) -> Tools {
        Tools { tools }
    }

    /// Runs the tool `call` names with its arguments parsed; a name this
    /// module does not know is a tool error.
    pub fn dispatch(&self, call: &ToolCall) -> Result<String, String> {
        let tool = self
            .tools
            .iter()
            .find(|(name, _)| *name == call.name)
            .map(|(_, f)| *f)
            .ok_or_else(|| format!("no tool `{}` in this module", call.name))?;
        let arguments = serde_json::from_str(&call.arguments_json)
            .map_err(|e| format!("the arguments are not JSON: {e}"))?;
        tool(arguments)
    }
}

/// Logs a line at `info`.
pub fn info(message: &str) {
    log::write(log::Level::Info, message);
}

/// Logs a line at `warn`.
pub fn warn(message: &str) {
    log::write(log::Level::Warn, message);
}
