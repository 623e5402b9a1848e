//! GitLab: two schemes, chosen by the headers a delivery carries.
//!
//! - Classic: `X-Gitlab-Token` equals the configured token (secret
//!   `gitlab_webhook_token`), compared in constant time.
//! - Signing tokens, in the Standard Webhooks format: `webhook-id`,
//!   `webhook-timestamp` and `webhook-signature` (`v1,<base64>`, several
//!   separated by spaces). The signed content is `id.timestamp.body`; the key
//!   is the base64 after `whsec_` in secret `gitlab_signing_token`. A
//!   timestamp more than five minutes from now, either way, is refused, so a
//!   captured delivery cannot be replayed later.
//!
//! A delivery with `webhook-signature` is always checked as signed; it never
//! falls back to the classic token.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::json::{extend_unique, first_string, names_in, string_at};
use crate::{
    Addressed, Delivery, Input, ParseError, Parsed, VerifyError, at_mentions, constant_time_eq,
};

/// The classic token's secret name.
pub const TOKEN_SECRET: &str = "gitlab_webhook_token";
/// The signing token's secret name (`whsec_<base64>`).
pub const SIGNING_SECRET: &str = "gitlab_signing_token";
/// How far a signed timestamp may be from now, in seconds, either way.
pub const TOLERANCE_SECONDS: i64 = 5 * 60;

/// Verifies either scheme.
pub fn verify(input: &Input<'_>) -> Result<(), VerifyError> {
    if input.header("webhook-signature").is_some() {
        let key = signing_key(input.require_secret(SIGNING_SECRET)?)?;
        verify_standard(input, &key)
    } else {
        let expected = input.require_secret(TOKEN_SECRET)?;
        let token = input.require_header("x-gitlab-token")?;
        if constant_time_eq(token.as_bytes(), expected) {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }
}

fn signing_key(secret: &[u8]) -> Result<Vec<u8>, VerifyError> {
    let text = std::str::from_utf8(secret).ok();
    text.map(|t| t.strip_prefix("whsec_").unwrap_or(t))
        .and_then(|b64| STANDARD.decode(b64).ok())
        .ok_or_else(|| VerifyError::MissingSecret(format!("{SIGNING_SECRET} (not whsec_<base64>)")))
}

/// Verifies a Standard Webhooks signature with an already decoded key.
pub fn verify_standard(input: &Input<'_>, key: &[u8]) -> Result<(), VerifyError> {
    let id = input.require_header("webhook-id")?;
    let timestamp_text = input.require_header("webhook-timestamp")?;
    let signatures = input.require_header("webhook-signature")?;
    let timestamp: i64 = timestamp_text
        .trim()
        .parse()
        .map_err(|_| VerifyError::MalformedHeader("webhook-timestamp".to_string()))?;
    if (input.now_unix_seconds - timestamp).abs() > TOLERANCE_SECONDS {
        return Err(VerifyError::StaleTimestamp(timestamp));
    }
    let mut any_v1 = false;
    for candidate in signatures.split(' ').filter(|s| !s.is_empty()) {
        let Some(encoded) = candidate.strip_prefix("v1,") else {
            continue;
        };
        any_v1 = true;
        let Ok(signature) = STANDARD.decode(encoded) else {
            continue;
        };
        let parts: [&[u8]; 5] = [
            id.as_bytes(),
            b".",
            timestamp_text.as_bytes(),
            b".",
            input.body,
        ];
        if crate::hmac_sha256_verify(key, &parts, &signature) {
            return Ok(());
        }
    }
    if any_v1 {
        Err(VerifyError::Mismatch)
    } else {
        Err(VerifyError::MalformedHeader(
            "webhook-signature".to_string(),
        ))
    }
}

/// Turns a verified delivery into one normalised delivery.
pub fn parse(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let payload = crate::parse_json(input.body)?;
    let kind = string_at(&payload, &["object_kind"])
        .or_else(|| string_at(&payload, &["event_name"]))
        .or_else(|| input.header("x-gitlab-event").map(str::to_string))
        .ok_or_else(|| ParseError::MissingField("object_kind".to_string()))?;
    let event_type = match string_at(&payload, &["object_attributes", "action"]) {
        Some(action) => format!("{kind}.{action}"),
        None => kind,
    };
    let delivery_id = input
        .header("x-gitlab-event-uuid")
        .or_else(|| input.header("webhook-id"))
        .ok_or_else(|| ParseError::MissingField("header x-gitlab-event-uuid".to_string()))?;
    let text = first_string(
        &payload,
        &[
            &["object_attributes", "note"],
            &["object_attributes", "description"],
        ],
    );
    let mut assignees = names_in(&payload, &["assignees"], "username");
    extend_unique(
        &mut assignees,
        names_in(&payload, &["merge_request", "assignees"], "username"),
    );
    let reviewers = names_in(&payload, &["reviewers"], "username");
    let thread = first_string(
        &payload,
        &[
            &["merge_request", "iid"],
            &["issue", "iid"],
            &["object_attributes", "iid"],
        ],
    );
    let addressed = Addressed {
        mentions: text.as_deref().map(at_mentions).unwrap_or_default(),
        assignees,
        reviewers,
        channel: string_at(&payload, &["project", "path_with_namespace"]),
        thread,
    };
    Ok(Parsed {
        deliveries: vec![Delivery {
            source: "gitlab".to_string(),
            // A note (a comment) waits for an answer; the rest asks for work.
            owed: event_type
                .starts_with("note")
                .then(|| addressed.reply_here())
                .flatten(),
            event_type,
            delivery_id: delivery_id.to_string(),
            addressed,
            text,
            payload: input.body.to_vec(),
            sender: string_at(&payload, &["user", "username"])
                .into_iter()
                .collect(),
            wakes: crate::Wakes::RouteAndNamed,
            message: None,
        }],
        reply: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The Standard Webhooks reference vector.
    const SECRET: &[u8] = b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: &str = "1614265330";
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn run(sig: &str, now: i64) -> Result<(), VerifyError> {
        let headers = [
            ("webhook-id", ID),
            ("webhook-timestamp", TS),
            ("webhook-signature", sig),
        ];
        let secrets = [(SIGNING_SECRET, SECRET)];
        verify(&Input {
            route: "/webhooks/gitlab",
            headers: &headers,
            body: BODY,
            secrets: &secrets,
            now_unix_seconds: now,
        })
    }

    #[test]
    fn reference_vector_and_window() {
        assert_eq!(run(SIG, 1614265330), Ok(()));
        assert_eq!(run(&format!("v1,bogus= {SIG}"), 1614265330 + 299), Ok(()));
        assert_eq!(
            run(SIG, 1614265330 + 301),
            Err(VerifyError::StaleTimestamp(1614265330))
        );
        assert_eq!(
            run(SIG, 1614265330 - 301),
            Err(VerifyError::StaleTimestamp(1614265330))
        );
        assert_eq!(
            run("v2,abc", 1614265330),
            Err(VerifyError::MalformedHeader("webhook-signature".into()))
        );
    }
}
