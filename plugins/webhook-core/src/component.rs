//! The adapter a webhook component uses: WIT request in, this crate's
//! functions in the middle, WIT result out. Each plugin crate is then two
//! lines of glue.

use crewlet_plugin_sdk::webhook as wit;

use crate::{Delivery, Input, ParseError, Parsed, VerifyError};

/// Runs `f` over the request borrowed as an [`Input`].
pub fn with_input<R>(req: &wit::Request, f: impl FnOnce(&Input<'_>) -> R) -> R {
    let headers: Vec<(&str, &str)> = req
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_str()))
        .collect();
    let secrets: Vec<(&str, &[u8])> = req
        .secrets
        .iter()
        .map(|s| (s.name.as_str(), s.value.as_slice()))
        .collect();
    f(&Input {
        route: &req.route,
        headers: &headers,
        body: &req.body,
        secrets: &secrets,
        now_unix_seconds: req.now_unix_seconds,
    })
}

/// `verify` for a component, over a core verify function.
pub fn verify(
    req: wit::Request,
    f: impl FnOnce(&Input<'_>) -> Result<(), VerifyError>,
) -> Result<(), wit::VerifyError> {
    with_input(&req, f).map_err(|e| match e {
        VerifyError::MissingHeader(h) => wit::VerifyError::MissingHeader(h),
        VerifyError::MalformedHeader(h) => wit::VerifyError::MalformedHeader(h),
        VerifyError::Mismatch => wit::VerifyError::Mismatch,
        VerifyError::StaleTimestamp(t) => wit::VerifyError::StaleTimestamp(t),
        VerifyError::MissingSecret(s) => wit::VerifyError::MissingSecret(s),
    })
}

/// `parse` for a component, over a core parse function.
pub fn parse(
    req: wit::Request,
    f: impl FnOnce(&Input<'_>) -> Result<Parsed, ParseError>,
) -> Result<wit::Parsed, wit::ParseError> {
    match with_input(&req, f) {
        Ok(parsed) => Ok(wit::Parsed {
            deliveries: parsed.deliveries.into_iter().map(delivery).collect(),
            reply: parsed.reply.map(|r| wit::Reply {
                content_type: r.content_type,
                body: r.body,
            }),
        }),
        Err(ParseError::MalformedBody(m)) => Err(wit::ParseError::MalformedBody(m)),
        Err(ParseError::MissingField(f)) => Err(wit::ParseError::MissingField(f)),
    }
}

fn delivery(d: Delivery) -> wit::Delivery {
    wit::Delivery {
        source: d.source,
        event_type: d.event_type,
        delivery_id: d.delivery_id,
        addressed: wit::Addressed {
            mentions: d.addressed.mentions,
            assignees: d.addressed.assignees,
            reviewers: d.addressed.reviewers,
            channel: d.addressed.channel,
            thread: d.addressed.thread,
        },
        text: d.text,
        payload: d.payload,
        owed: d.owed.map(|o| wit::ReplyTo {
            channel: o.channel,
            thread: o.thread,
        }),
        sender: d.sender,
        wakes: match d.wakes {
            crate::Wakes::RouteAndNamed => wit::Wakes::RouteAndNamed,
            crate::Wakes::Named => wit::Wakes::Named,
            crate::Wakes::Nobody(why) => wit::Wakes::Nobody(why),
        },
        message: d.message,
    }
}
