//! GitHub: `X-Hub-Signature-256: sha256=<hex>`, an HMAC-SHA256 of the raw
//! body under the webhook secret (secret name `github_webhook_secret`).
//!
//! The event type is `X-GitHub-Event` joined with the payload's `action`
//! (`issue_comment.created`); the delivery id is `X-GitHub-Delivery`, which
//! GitHub keeps across redeliveries, so it is the dedupe key.

use serde::Deserialize;

use crate::json::extend_unique;
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

/// The fields of a GitHub payload the delivery is made of. Everything else
/// (a real `issue_comment` is ~10 KB of URLs and user records) is skipped
/// by the deserializer without being built: a full `Value` tree of it cost
/// the guest more than verifying the signature.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Payload {
    action: Option<String>,
    comment: Option<Item>,
    review: Option<Item>,
    issue: Option<Item>,
    pull_request: Option<Item>,
    discussion: Option<Item>,
    assignee: Option<Login>,
    requested_reviewer: Option<Login>,
    repository: Option<Repository>,
    sender: Option<Login>,
}

/// An issue, pull request, discussion, comment or review.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Item {
    body: Option<String>,
    number: Option<u64>,
    assignees: Option<Vec<Login>>,
    requested_reviewers: Option<Vec<Login>>,
}

/// A user (or, among requested reviewers, a team: no `login`).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Login {
    login: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Repository {
    full_name: Option<String>,
}

fn logins(list: Option<&Vec<Login>>) -> impl Iterator<Item = String> + '_ {
    list.into_iter().flatten().filter_map(|l| l.login.clone())
}

/// Whether the sender of an event of this type waits for an answer on the
/// issue, pull request or discussion: a comment, a review, a new issue or
/// discussion. An assignment or a review request asks for work.
fn conversational(event_type: &str) -> bool {
    [
        "issue_comment.",
        "pull_request_review_comment.",
        "pull_request_review.",
        "discussion_comment.",
        "issues.opened",
        "discussion.created",
    ]
    .iter()
    .any(|p| event_type.starts_with(p))
}

/// Turns a verified delivery into one normalised delivery.
pub fn parse(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let event = input
        .header("x-github-event")
        .ok_or_else(|| ParseError::MissingField("header x-github-event".to_string()))?;
    let delivery_id = input
        .header("x-github-delivery")
        .ok_or_else(|| ParseError::MissingField("header x-github-delivery".to_string()))?;
    let payload: Payload = crate::parse_json_as(input.body)?;
    let event_type = match &payload.action {
        Some(action) => format!("{event}.{action}"),
        None => event.to_string(),
    };
    let items = [
        &payload.comment,
        &payload.review,
        &payload.issue,
        &payload.pull_request,
        &payload.discussion,
    ];
    let text = items
        .iter()
        .filter_map(|i| i.as_ref()?.body.clone())
        .find(|b| !b.is_empty());
    let issue = payload.issue.as_ref();
    let pull = payload.pull_request.as_ref();
    let mut assignees = Vec::new();
    extend_unique(
        &mut assignees,
        logins(issue.and_then(|i| i.assignees.as_ref())),
    );
    extend_unique(
        &mut assignees,
        logins(pull.and_then(|p| p.assignees.as_ref())),
    );
    extend_unique(
        &mut assignees,
        payload.assignee.as_ref().and_then(|a| a.login.clone()),
    );
    let mut reviewers = Vec::new();
    extend_unique(
        &mut reviewers,
        logins(pull.and_then(|p| p.requested_reviewers.as_ref())),
    );
    extend_unique(
        &mut reviewers,
        payload
            .requested_reviewer
            .as_ref()
            .and_then(|r| r.login.clone()),
    );
    let thread = [issue, pull, payload.discussion.as_ref()]
        .into_iter()
        .find_map(|i| i?.number)
        .map(|n| n.to_string());
    let addressed = Addressed {
        mentions: text.as_deref().map(at_mentions).unwrap_or_default(),
        assignees,
        reviewers,
        channel: payload.repository.and_then(|r| r.full_name),
        thread,
    };
    let delivery = Delivery {
        source: "github".to_string(),
        owed: conversational(&event_type)
            .then(|| addressed.reply_here())
            .flatten(),
        event_type,
        delivery_id: delivery_id.to_string(),
        addressed,
        text,
        payload: input.body.to_vec(),
        sender: payload.sender.and_then(|s| s.login).into_iter().collect(),
        wakes: crate::Wakes::RouteAndNamed,
        message: None,
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
