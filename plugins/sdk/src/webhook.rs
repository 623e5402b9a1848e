//! The `webhook` world.
//!
//! Its import `crypto` is reached through [`hmac_sha256`]: every guest's
//! HMAC is the host's (native SHA-256, several times faster than a guest's,
//! on every delivery's whole body). Its import [`log`] writes a line to the
//! node's log, tagged with the plugin.

wit_bindgen::generate!({
    world: "webhook",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "export_webhook",
    default_bindings_module: "crewlet_plugin_sdk::webhook",
});

pub use crewlet::plugin::log;
pub use crewlet::plugin::types::Header;
pub use exports::crewlet::plugin::inbound::{
    Addressed, Delivery, Guest, ParseError, Parsed, Reply, ReplyTo, Request, Secret, VerifyError,
    Wakes,
};

/// HMAC-SHA256 of the concatenation of `parts` under `key`, computed by the
/// host.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let joined;
    let data: &[u8] = match parts {
        [one] => one,
        _ => {
            joined = parts.concat();
            &joined
        }
    };
    crewlet::plugin::crypto::hmac_sha256(key, data)
        .try_into()
        .expect("the host's HMAC-SHA256 is 32 bytes long")
}

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
