//! The `module` world: state and logging imports, handler exports.

wit_bindgen::generate!({
    world: "module",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "export_module",
    default_bindings_module: "crewlet_plugin_sdk::module",
});

pub use crewlet::plugin::log;
pub use crewlet::plugin::state::{self, Entry, StateError};
pub use exports::crewlet::plugin::handlers::{Event, Guest, StateChange, StateEvent};

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

/// Logs a line at `info`.
pub fn info(message: &str) {
    log::write(log::Level::Info, message);
}

/// Logs a line at `warn`.
pub fn warn(message: &str) {
    log::write(log::Level::Warn, message);
}
