//! Jira and Confluence: `X-Hub-Signature: sha256=<hex>`, an HMAC-SHA256 of
//! the raw body under the webhook's secret. One plugin serves both routes;
//! the route picks the source and the secret (`jira_webhook_secret` for a
//! route ending in `/jira`, `confluence_webhook_secret` otherwise).
//!
//! The delivery id is `X-Atlassian-Webhook-Identifier`, stable across
//! Atlassian's retries. Jira mentions are `[~accountid:<id>]` in a comment
//! body; Confluence's are `ri:account-id="<id>"` in storage format, read
//! when the payload carries a body (`comment.body.storage.value`).

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
            &["comment", "body", "storage", "value"],
            &["issue", "fields", "description"],
            &["page", "body", "storage", "value"],
            &["page", "title"],
        ],
    );
    let mentioned = if source == "jira" {
        account_mentions
    } else {
        storage_mentions
    };
    let assignees = string_at(&payload, &["issue", "fields", "assignee", "accountId"])
        .into_iter()
        .collect();
    let addressed = Addressed {
        mentions: text.as_deref().map(mentioned).unwrap_or_default(),
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
            sender: first_string(
                &payload,
                &[&["comment", "author", "accountId"], &["user", "accountId"]],
            )
            .into_iter()
            .collect(),
            wakes: crate::Wakes::RouteAndNamed,
            message: None,
        }],
        reply: None,
    })
}

/// Jira's `[~accountid:<id>]` mentions, as account ids (as Jira sends
/// them, so they match a seat's `identities.jira`). A mention not closed by
/// `]` right after its id (truncated, or mangled) names nobody.
pub fn account_mentions(text: &str) -> Vec<String> {
    delimited_ids(text, "[~accountid:", b']')
}

/// Confluence's mentions in storage format
/// (`<ac:link><ri:user ri:account-id="<id>" /></ac:link>`), as account ids:
/// the same ids as Jira's, so one `identities.confluence` entry per seat.
pub fn storage_mentions(text: &str) -> Vec<String> {
    delimited_ids(text, "ri:account-id=\"", b'"')
}

/// The ids between `open` and `close`, each of account-id characters
/// (letters, digits, `:`, `-`, `_`), in order, without duplicates.
fn delimited_ids(text: &str, open: &str, close: u8) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(open) {
        let after = &rest[start + open.len()..];
        let len = after
            .bytes()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_'))
            .count();
        let id = &after[..len];
        if len > 0 && after.as_bytes().get(len) == Some(&close) && !out.iter().any(|m| m == id) {
            out.push(id.to_string());
        }
        rest = &after[len..];
    }
    out
}
