//! `crewlet webhook sample`: sends a signed sample delivery to a running
//! node, exactly as the source would (Slack's `v0` signature over the
//! timestamp and body), so the whole path can be watched end to end.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::client::{ClientError, request};

#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error(
        "the signing secret is not set: export {0} with the value the node verifies with (./dev run sets a demo value)"
    )]
    NoSecret(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the node answered {status}: {body}")]
    Refused { status: u16, body: String },
}

/// What to send.
pub struct Sample<'a> {
    pub api: &'a str,
    pub handle: &'a str,
    pub channel: &'a str,
    pub text: &'a str,
    /// The signing secret's value.
    pub secret: &'a str,
}

/// Sends a signed Slack `app_mention` to `/webhooks/slack/HANDLE`; answers
/// the node's reply (the delivery's trace ids).
pub fn send_slack(s: &Sample<'_>) -> Result<String, SampleError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let ts = format!("{}.{:06}", now.as_secs(), now.subsec_micros());
    let body = serde_json::json!({
        "type": "event_callback",
        "team_id": "T0CREWLET",
        "event_id": format!("EvSample{}", now.as_micros()),
        "event": {
            "type": "app_mention",
            "user": "U0SAMPLE",
            "text": format!("<@{}> {}", s.handle, s.text),
            "channel": s.channel,
            "ts": ts,
        },
    })
    .to_string();
    let timestamp = now.as_secs().to_string();
    let signature =
        crewlet_ingress::sign::slack_signature(s.secret.as_bytes(), &timestamp, body.as_bytes());
    let (status, answer) = request(
        s.api,
        "POST",
        &format!("/webhooks/slack/{}", s.handle),
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &timestamp),
            ("X-Slack-Signature", &signature),
        ],
        body.as_bytes(),
    )?;
    if !(200..300).contains(&status) {
        return Err(SampleError::Refused {
            status,
            body: answer,
        });
    }
    Ok(format!(
        "sent a signed Slack app_mention to @{} in {} (thread {ts}): {status} {}",
        s.handle,
        s.channel,
        answer.trim()
    ))
}
