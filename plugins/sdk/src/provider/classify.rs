//! Turning a failed model call into a [`ProviderError`]: one classifier for
//! every provider plugin, so the same failure gets the same kind whichever
//! vendor reported it.
//!
//! Rules, and why:
//! - A plugin classifies and never retries: the host's pool benches a key on
//!   rate-limit or auth and its chain falls back, which a retry inside the
//!   plugin would hide.
//! - The kind comes from the status and from what the body says, read in
//!   every documented error shape at once ([`VendorBody`]: OpenAI's
//!   `{"error":{"message","type","code"}}`, Anthropic's
//!   `{"type":"error","error":{"type","message"}}`, the flat
//!   `{"message","type"}` and `{"error":"…"}` of compatible servers), so a
//!   plugin never carries its own table and an OpenAI-compatible server
//!   that phrases a failure like another vendor is still understood.
//! - In order ([`kind_of`]): rate limit (429, `rate_limit_error`,
//!   `rate_limit_exceeded`) → `rate-limited` with the advised wait; a
//!   refused or unpaid key (401, 402, 403, `authentication_error`,
//!   `permission_error`, `billing_error`, `invalid_api_key`,
//!   `insufficient_quota`) → `auth`, because another key may work and
//!   waiting will not; overloaded (503, 529, `overloaded_error`) →
//!   `overloaded`; a timeout (408, 504, `timeout_error`) → `transient`; a
//!   4xx whose code or message says the prompt does not fit the context
//!   window ([`says_context_too_long`]) → `context-too-long`; any other 4xx
//!   → `bad-request`; everything else → `transient`.
//! - The message is redacted ([`redact`]): never the key, a URL or anything
//!   key-shaped, because the host logs and records it; never the raw body.

use super::http::{self, HttpFailure};
use super::{ErrorKind, ProviderError};
use serde_json::Value;

/// What a vendor's error body says, from whichever documented shape it has.
/// Every field is empty when the body is not JSON or says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VendorBody {
    /// The machine code (OpenAI's `error.code`), when a string.
    pub code: String,
    /// The error type (`error.type`: Anthropic's `overloaded_error`,
    /// OpenAI's `invalid_request_error`).
    pub kind: String,
    /// The vendor's own words.
    pub message: String,
}

impl VendorBody {
    /// Reads `body` in every shape [the module](self) lists.
    pub fn read(body: &[u8]) -> VendorBody {
        let Ok(value) = serde_json::from_slice::<Value>(body) else {
            return VendorBody::default();
        };
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        match &value["error"] {
            Value::Object(_) => {
                let error = &value["error"];
                VendorBody {
                    code: text(&error["code"]),
                    kind: text(&error["type"]),
                    message: text(&error["message"]),
                }
            }
            Value::String(message) => VendorBody {
                message: message.clone(),
                ..VendorBody::default()
            },
            _ => VendorBody {
                code: text(&value["code"]),
                kind: text(&value["type"]),
                message: match &value["message"] {
                    Value::String(m) => m.clone(),
                    _ => text(&value["detail"]),
                },
            },
        }
    }

    fn says(&self, names: &[&str]) -> bool {
        names.contains(&self.code.as_str()) || names.contains(&self.kind.as_str())
    }
}

/// Whether a 4xx body says the prompt does not fit the model's context
/// window: the code `context_length_exceeded`, or a message in one of the
/// phrasings vendors and compatible servers use ("maximum context length",
/// "exceeds the context window", "prompt is too long", "exceed context
/// limit", "input token count … exceeds the maximum").
pub fn says_context_too_long(body: &VendorBody) -> bool {
    if body.code == "context_length_exceeded" {
        return true;
    }
    let message = body.message.to_ascii_lowercase();
    [
        "context length",
        "context window",
        "context limit",
        "prompt is too long",
        "input token count",
    ]
    .iter()
    .any(|phrase| message.contains(phrase))
}

/// The kind of a failed response with `status` and `body`; `retry_after_ms`
/// is the wait it advised ([`retry_after_ms`]).
pub fn kind_of(status: u16, retry_after_ms: Option<u64>, body: &VendorBody) -> ErrorKind {
    if status == 429 || body.says(&["rate_limit_error", "rate_limit_exceeded"]) {
        if body.says(&["insufficient_quota"]) {
            return ErrorKind::Auth;
        }
        return ErrorKind::RateLimited(retry_after_ms);
    }
    if (401..=403).contains(&status)
        || body.says(&[
            "authentication_error",
            "permission_error",
            "billing_error",
            "invalid_api_key",
            "insufficient_quota",
        ])
    {
        return ErrorKind::Auth;
    }
    if matches!(status, 503 | 529) || body.says(&["overloaded_error"]) {
        return ErrorKind::Overloaded;
    }
    if matches!(status, 408 | 504) || body.says(&["timeout_error"]) {
        return ErrorKind::Transient;
    }
    if (400..500).contains(&status) {
        if says_context_too_long(body) {
            return ErrorKind::ContextTooLong;
        }
        return ErrorKind::BadRequest;
    }
    ErrorKind::Transient
}

/// The classified error for a response that is not a success.
pub fn classify(response: &http::Response, request_id: Option<String>, key: &str) -> ProviderError {
    let body = VendorBody::read(&response.body);
    let kind = kind_of(response.status, retry_after_ms(response), &body);
    let message = if body.message.is_empty() {
        format!("HTTP {} without a documented error body", response.status)
    } else {
        redact(&body.message, key)
    };
    ProviderError {
        kind,
        status: Some(response.status),
        request_id,
        message,
    }
}

/// The wait a response advises, in milliseconds: `retry-after-ms`, else
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

#[cfg(test)]
mod tests;
