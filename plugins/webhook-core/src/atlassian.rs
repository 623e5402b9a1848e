//! Jira and Confluence: `X-Hub-Signature: sha256=<hex>`, an HMAC-SHA256 of
//! the raw body under the webhook's secret. One plugin serves both routes;
//! the route picks the source and the secret (`jira_webhook_secret` for a
//! route ending in `/jira`, `confluence_webhook_secret` otherwise).
//!
//! The delivery id is `X-Atlassian-Webhook-Identifier`, stable across
//! Atlassian's retries. Jira mentions are `[~accountid:<id>]`.

use crate::json::{first_string, string_at};
use crate::{Addressed, Delivery, Input, ParseError, Parsed, VerifyError, decode_hex};

pub const JIRA_SECRET: &str = "jira_webhook_secret";
pub const CONFLUENCE_SECRET: &str = "confluence_webhook_secret";
const SIGNATURE_HEADER: &str = "x-hub-signature";

/// Which product a route serves.
pub fn source(route: &str) -> &'static str {
    if route.trim_end_matches('/').ends_with("/jira") {
        "jira"
    } else {
        "confluence"
    }
}

/// Checks `X-Hub-Signature` (sha256 only; Atlassian's other algorithms are
/// refused as malformed rather than silently accepted).
pub fn verify(input: &Input<'_>) -> Result<(), VerifyError> {
    let secret_name = if source(input.route) == "jira" {
        JIRA_SECRET
    } else {
        CONFLUENCE_SECRET
    };
    let secret = input.require_secret(secret_name)?;
    let header = input.require_header(SIGNATURE_HEADER)?;
    let signature = header
        .strip_prefix("sha256=")
        .and_then(decode_hex)
        .filter(|s| s.len() == 32)
        .ok_or_else(|| VerifyError::MalformedHeader(SIGNATURE_HEADER.to_string()))?;
    if crate::hmac_sha256_verify(secret, &[input.body], &signature) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// Turns a verified delivery into one normalised delivery.
pub fn parse(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let source = source(input.route);
    let payload = crate::parse_json(input.body)?;
    let event_type = first_string(&payload, &[&["webhookEvent"], &["eventType"], &["event"]])
        .ok_or_else(|| ParseError::MissingField("webhookEvent".to_string()))?;
    let delivery_id = input
        .header("x-atlassian-webhook-identifier")
        .map(str::to_string)
        .or_else(|| string_at(&payload, &["timestamp"]).map(|t| format!("{event_type}-{t}")))
        .ok_or_else(|| {
            ParseError::MissingField("header x-atlassian-webhook-identifier".to_string())
        })?;
    let text = first_string(
        &payload,
        &[
            &["comment", "body"],
            &["issue", "fields", "description"],
            &["page", "title"],
        ],
    );
    let assignees = string_at(&payload, &["issue", "fields", "assignee", "accountId"])
        .into_iter()
        .collect();
    let addressed = Addressed {
        mentions: text.as_deref().map(account_mentions).unwrap_or_default(),
        assignees,
        reviewers: Vec::new(),
        channel: first_string(
            &payload,
            &[
                &["issue", "fields", "project", "key"],
                &["page", "spaceKey"],
                &["space", "key"],
            ],
        ),
        thread: first_string(&payload, &[&["issue", "key"], &["page", "id"]]),
    };
    Ok(Parsed {
        deliveries: vec![Delivery {
            source: source.to_string(),
            // A comment waits for an answer on its issue or page.
            owed: event_type
                .contains("comment")
                .then(|| addressed.reply_here())
                .flatten(),
            event_type,
            delivery_id,
            addressed,
            text,
            payload: input.body.to_vec(),
        }],
        reply: None,
    })
}

/// Jira's `[~accountid:<id>]` mentions, as account ids.
pub fn account_mentions(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("[~accountid:") {
        let after = &rest[start + "[~accountid:".len()..];
        let Some(end) = after.find(']') else { break };
        let id = &after[..end];
        if !id.is_empty() && !out.iter().any(|m| m == id) {
            out.push(id.to_string());
        }
        rest = &after[end + 1..];
    }
    out
}
