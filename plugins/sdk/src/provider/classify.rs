//! Turning a failed model call into a [`ProviderError`], the same way in
//! every provider plugin.
//!
//! Rules, and why:
//! - A plugin classifies and never retries: the host's pool benches a key on
//!   rate-limit or auth and its chain falls back, which a retry inside the
//!   plugin would hide.
//! - The statuses mean the same at every vendor (429 rate-limited with the
//!   advised wait, 401/403 auth, other 4xx bad-request, other 5xx
//!   transient); only what a vendor's body says — its message, whether the
//!   prompt was too long, which statuses mean "overloaded" — is the
//!   plugin's, in [`VendorError`].
//! - The message is redacted ([`redact`]): never the key, a URL or anything
//!   key-shaped, because the host logs and records it.

use super::http::{self, HttpFailure};
use super::{ErrorKind, ProviderError};

/// What a vendor's error response said, read by the plugin that knows its
/// body's shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct VendorError<'a> {
    /// The vendor's own message; empty when the body had none.
    pub message: &'a str,
    /// The body says the prompt does not fit the model's context (on a 400).
    pub context_too_long: bool,
    /// The statuses this vendor answers when it is overloaded.
    pub overloaded: &'a [u16],
}

/// The classified error for a response that is not a success.
pub fn classify(
    response: &http::Response,
    request_id: Option<String>,
    key: &str,
    vendor: VendorError<'_>,
) -> ProviderError {
    let kind = match response.status {
        429 => ErrorKind::RateLimited(retry_after_ms(response)),
        401 | 403 => ErrorKind::Auth,
        400 if vendor.context_too_long => ErrorKind::ContextTooLong,
        s if vendor.overloaded.contains(&s) => ErrorKind::Overloaded,
        s if (400..500).contains(&s) => ErrorKind::BadRequest,
        _ => ErrorKind::Transient,
    };
    let message = if vendor.message.is_empty() {
        format!("HTTP {} without a documented error body", response.status)
    } else {
        redact(vendor.message, key)
    };
    ProviderError {
        kind,
        status: Some(response.status),
        request_id,
        message,
    }
}

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
