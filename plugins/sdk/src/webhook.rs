//! The `webhook` world.

wit_bindgen::generate!({
    world: "webhook",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "export_webhook",
    default_bindings_module: "crewlet_plugin_sdk::webhook",
});

pub use crewlet::plugin::types::Header;
pub use exports::crewlet::plugin::inbound::{
    Addressed, Delivery, Guest, ParseError, Parsed, Reply, Request, Secret, VerifyError,
};

impl Request {
    /// The first header with this name (names are lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// The secret the host resolved under `name`.
    pub fn secret(&self, name: &str) -> Option<&[u8]> {
        self.secrets
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value.as_slice())
    }
}
