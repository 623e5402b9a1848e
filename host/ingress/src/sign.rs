//! Signing sample, test and benchmark deliveries the way GitHub
//! (`X-Hub-Signature-256: sha256=HEX`) and Slack (`X-Slack-Signature:
//! v0=HEX` over `v0:TIMESTAMP:BODY`) do, with the host's one HMAC-SHA256
//! ([`crewlet_plugins::crypto`]). Verification happens in the plugins,
//! never here.

pub use crewlet_plugins::crypto::hmac_sha256;

/// The `X-Hub-Signature-256` value GitHub sends for `body`.
pub fn github_signature(secret: &[u8], body: &[u8]) -> String {
    let mac = hmac_sha256(secret, body);
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The `X-Slack-Signature` value Slack sends for `body` at `timestamp`
/// (`v0=HEX` of `v0:TIMESTAMP:BODY`).
pub fn slack_signature(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    versioned("v0", secret, timestamp, body)
}

/// The company chat's `X-Chat-Signature` for `body` at `timestamp`
/// (`v1=HEX` of `v1:TIMESTAMP:BODY`, `docs/chat.md`).
pub fn chat_signature(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    versioned("v1", secret, timestamp, body)
}

/// `VERSION=HEX` of the HMAC of `VERSION:TIMESTAMP:BODY`.
fn versioned(version: &str, secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let mut base = format!("{version}:{timestamp}:").into_bytes();
    base.extend_from_slice(body);
    let hex: String = hmac_sha256(secret, &base)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{version}={hex}")
}

/// `X-Slack-Request-Timestamp` (now) and `X-Slack-Signature` for `body`.
pub fn slack_headers(secret: &[u8], body: &[u8]) -> (String, String) {
    let timestamp = now_seconds();
    let signature = slack_signature(secret, &timestamp, body);
    (timestamp, signature)
}

/// `X-Chat-Timestamp` (now) and `X-Chat-Signature` for `body`.
pub fn chat_headers(secret: &[u8], body: &[u8]) -> (String, String) {
    let timestamp = now_seconds();
    let signature = chat_signature(secret, &timestamp, body);
    (timestamp, signature)
}

fn now_seconds() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
        .to_string()
}
