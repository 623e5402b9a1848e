//! Datadog: a shared token in a fixed header. Datadog's webhook integration
//! attaches only fixed-value custom headers, so nothing varies with the
//! payload to sign; the token (secret `datadog_webhook_token`) is compared in
//! constant time against header `x-crewlet-webhook-token`, which the operator
//! configures in Datadog's "Custom Headers".
//!
//! The payload is the operator's template; the plugin expects the fields of
//! the documented default template (`id`, `event_type`, `title`, `body`,
//! `alert_id`, `tags`) and names an `@handle` in the body as addressed.

use crate::json::{first_string, string_at};
use crate::{
    Addressed, Delivery, Input, ParseError, Parsed, VerifyError, at_mentions, constant_time_eq,
};

/// The token's secret name.
pub const SECRET: &str = "datadog_webhook_token";
/// The header the operator configures with the token.
pub const TOKEN_HEADER: &str = "x-crewlet-webhook-token";

/// Compares the token in constant time.
pub fn verify(input: &Input<'_>) -> Result<(), VerifyError> {
    let expected = input.require_secret(SECRET)?;
    let token = input.require_header(TOKEN_HEADER)?;
    if constant_time_eq(token.trim().as_bytes(), expected) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// Turns a verified alert into one normalised delivery.
pub fn parse(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let payload = crate::parse_json(input.body)?;
    let delivery_id =
        string_at(&payload, &["id"]).ok_or_else(|| ParseError::MissingField("id".to_string()))?;
    let event_type = first_string(&payload, &[&["event_type"], &["alert_transition"]])
        .unwrap_or_else(|| "alert".to_string());
    let title = string_at(&payload, &["title"]);
    let body = string_at(&payload, &["body"]);
    let text = match (title, body) {
        (Some(t), Some(b)) => Some(format!("{t}\n\n{b}")),
        (t, b) => t.or(b),
    };
    Ok(Parsed {
        deliveries: vec![Delivery {
            source: "datadog".to_string(),
            event_type,
            delivery_id,
            addressed: Addressed {
                mentions: text.as_deref().map(at_mentions).unwrap_or_default(),
                channel: string_at(&payload, &["org", "name"]),
                thread: string_at(&payload, &["alert_id"]),
                ..Addressed::default()
            },
            text,
            payload: input.body.to_vec(),
            // An alert asks for work, never for a message back.
            owed: None,
            sender: Vec::new(),
            wakes: crate::Wakes::RouteAndNamed,
            message: None,
        }],
        reply: None,
    })
}
