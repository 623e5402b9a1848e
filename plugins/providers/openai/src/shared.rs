//! Classification helpers shared by the provider plugins (the same file is
//! included by each, so each component stays one crate).

use crewlet_plugin_sdk::provider::http::{self, HttpFailure};
use crewlet_plugin_sdk::provider::{ErrorKind, ProviderError};

/// The wait a 429 advises, in milliseconds: `retry-after-ms`, else
/// `retry-after` in seconds (an HTTP date is not parsed: no clock).
pub fn retry_after_ms(response: &http::Response) -> Option<u64> {
    if let Some(ms) = response
        .header("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        return Some(ms.max(0.0) as u64);
    }
    response
        .header("retry-after")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|s| (s.max(0.0) * 1000.0) as u64)
}

/// A vendor message made safe to log: the key, anything URL-shaped and
/// anything key-shaped replaced, and cut to 300 characters.
pub fn redact(message: &str, key: &str) -> String {
    let mut text = message.to_string();
    if key.len() >= 4 {
        text = text.replace(key, "[redacted key]");
    }
    let words: Vec<String> = text
        .split(' ')
        .map(|w| {
            if w.contains("://") {
                "[redacted url]".to_string()
            } else if (w.starts_with("sk-") || w.starts_with("sk_")) && w.len() > 8 {
                "[redacted key]".to_string()
            } else {
                w.to_string()
            }
        })
        .collect();
    let joined = words.join(" ");
    joined.chars().take(300).collect()
}

/// The classified error for a request that got no response.
pub fn denied_or_network(failure: HttpFailure, key: &str) -> ProviderError {
    let (kind, message) = match failure {
        HttpFailure::Denied(origin) => (
            ErrorKind::RequestDenied,
            format!("the host refused a request to {origin}: not in allowed_outbound_hosts"),
        ),
        HttpFailure::BadUrl(m) => (ErrorKind::BadRequest, m),
        HttpFailure::TooManyRedirects => (ErrorKind::Transient, "too many redirects".to_string()),
        HttpFailure::BodyTooLarge => (
            ErrorKind::Transient,
            "the response body was too large".to_string(),
        ),
        HttpFailure::Network(m) => (ErrorKind::Transient, redact(&m, key)),
    };
    ProviderError {
        kind,
        status: None,
        request_id: None,
        message,
    }
}
