//! Signing test and benchmark deliveries the way GitHub does
//! (`X-Hub-Signature-256: sha256=HEX`), with the host's one HMAC-SHA256
//! ([`crewlet_plugins::crypto`]). Verification happens in the plugins,
//! never here.

pub use crewlet_plugins::crypto::hmac_sha256;

/// The `X-Hub-Signature-256` value GitHub sends for `body`.
pub fn github_signature(secret: &[u8], body: &[u8]) -> String {
    let mac = hmac_sha256(secret, body);
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}
