//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, an HMAC-SHA256 of the raw
//! body under the webhook secret (secret name `github_webhook_secret`).
//!
//! The event type is `X-GitHub-Event` joined with the payload's `action`
//! (`issue_comment.created`); the delivery id is `X-GitHub-Delivery`, which
//! GitHub keeps across redeliveries, so it is the dedupe key.

use crate::json::{extend_unique, first_string, names_in, string_at};
use crate::{Addressed, Delivery, Input, ParseError, Parsed, VerifyError, at_mentions, decode_hex};

/// The secret name a GitHub plugin's manifest declares.
pub const SECRET: &str = "github_webhook_secret";
const SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// Checks `X-Hub-Signature-256` against the body.
pub fn verify(input: &Input<'_>) -> Result<(), VerifyError> {
    let secret = input.require_secret(SECRET)?;
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
    let event = input
        .header("x-github-event")
        .ok_or_else(|| ParseError::MissingField("header x-github-event".to_string()))?;
    let delivery_id = input
        .header("x-github-delivery")
        .ok_or_else(|| ParseError::MissingField("header x-github-delivery".to_string()))?;
    let payload = crate::parse_json(input.body)?;
    let event_type = match string_at(&payload, &["action"]) {
        Some(action) => format!("{event}.{action}"),
        None => event.to_string(),
    };
    let text = first_string(
        &payload,
        &[
            &["comment", "body"],
            &["review", "body"],
            &["issue", "body"],
            &["pull_request", "body"],
            &["discussion", "body"],
        ],
    );
    let mut assignees = names_in(&payload, &["issue", "assignees"], "login");
    extend_unique(
        &mut assignees,
        names_in(&payload, &["pull_request", "assignees"], "login"),
    );
    if let Some(login) = string_at(&payload, &["assignee", "login"]) {
        extend_unique(&mut assignees, [login]);
    }
    let mut reviewers = names_in(&payload, &["pull_request", "requested_reviewers"], "login");
    if let Some(login) = string_at(&payload, &["requested_reviewer", "login"]) {
        extend_unique(&mut reviewers, [login]);
    }
    let thread = first_string(
        &payload,
        &[
            &["issue", "number"],
            &["pull_request", "number"],
            &["discussion", "number"],
        ],
    );
    let delivery = Delivery {
        source: "github".to_string(),
        event_type,
        delivery_id: delivery_id.to_string(),
        addressed: Addressed {
            mentions: text.as_deref().map(at_mentions).unwrap_or_default(),
            assignees,
            reviewers,
            channel: string_at(&payload, &["repository", "full_name"]),
            thread,
        },
        text,
        payload: input.body.to_vec(),
    };
    Ok(Parsed {
        deliveries: vec![delivery],
        reply: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // GitHub's documented example ("Validating webhook deliveries").
    const DOC_SECRET: &[u8] = b"It's a Secret to Everybody";
    const DOC_BODY: &[u8] = b"Hello, World!";
    const DOC_SIGNATURE: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn input<'a>(
        headers: &'a [(&'a str, &'a str)],
        secrets: &'a [(&'a str, &'a [u8])],
    ) -> Input<'a> {
        Input {
            route: "/webhooks/github",
            headers,
            body: DOC_BODY,
            secrets,
            now_unix_seconds: 0,
        }
    }

    #[test]
    fn documented_vector_verifies_and_a_forgery_does_not() {
        let secrets = [(SECRET, DOC_SECRET)];
        assert_eq!(
            verify(&input(&[(SIGNATURE_HEADER, DOC_SIGNATURE)], &secrets)),
            Ok(())
        );
        let forged = DOC_SIGNATURE.replace("757107", "757108");
        assert_eq!(
            verify(&input(&[(SIGNATURE_HEADER, &forged)], &secrets)),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(&input(&[(SIGNATURE_HEADER, "sha256=zz")], &secrets)),
            Err(VerifyError::MalformedHeader(SIGNATURE_HEADER.into()))
        );
    }
}
