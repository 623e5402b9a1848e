//! A webhook component built against WIT 0.4.0: its `inbound` export
//! bound on its own (`host/plugins/wit-0.4.0`), its answers read as the
//! current `delivery` with no sender, waking its route's seat and whom it
//! names — what every delivery meant before 0.4.1. Its imports (`crypto`,
//! `log`) are the current package's, which 0.4.0's match by semver.

use super::{
    Addressed, Delivery, Header, ParseError, Parsed, Reply, ReplyTo, Request, VerifyError, Wakes,
};

wasmtime::component::bindgen!({
    path: "wit-0.4.0",
    world: "crewlet:plugin/webhook@0.4.0",
    imports: { default: async },
    exports: { default: async },
});

use exports::crewlet::plugin::inbound as old;

/// The export this version's components carry.
pub(super) const EXPORT: &str = "crewlet:plugin/inbound@0.4.0";

/// The request as 0.4.0 spells it.
pub(super) fn request(req: &Request) -> old::Request {
    old::Request {
        route: req.route.clone(),
        headers: req
            .headers
            .iter()
            .map(|Header { name, value }| crewlet::plugin::types::Header {
                name: name.clone(),
                value: value.clone(),
            })
            .collect(),
        body: req.body.clone(),
        secrets: req
            .secrets
            .iter()
            .map(|s| old::Secret {
                name: s.name.clone(),
                value: s.value.clone(),
            })
            .collect(),
        now_unix_seconds: req.now_unix_seconds,
    }
}

pub(super) fn verify_error(e: old::VerifyError) -> VerifyError {
    match e {
        old::VerifyError::MissingHeader(h) => VerifyError::MissingHeader(h),
        old::VerifyError::MalformedHeader(h) => VerifyError::MalformedHeader(h),
        old::VerifyError::Mismatch => VerifyError::Mismatch,
        old::VerifyError::StaleTimestamp(t) => VerifyError::StaleTimestamp(t),
        old::VerifyError::MissingSecret(s) => VerifyError::MissingSecret(s),
    }
}

pub(super) fn parsed(r: Result<old::Parsed, old::ParseError>) -> Result<Parsed, ParseError> {
    match r {
        Ok(p) => Ok(Parsed {
            deliveries: p.deliveries.into_iter().map(delivery).collect(),
            reply: p.reply.map(|r| Reply {
                content_type: r.content_type,
                body: r.body,
            }),
        }),
        Err(old::ParseError::MalformedBody(m)) => Err(ParseError::MalformedBody(m)),
        Err(old::ParseError::MissingField(f)) => Err(ParseError::MissingField(f)),
    }
}

fn delivery(d: old::Delivery) -> Delivery {
    Delivery {
        source: d.source,
        event_type: d.event_type,
        delivery_id: d.delivery_id,
        addressed: Addressed {
            mentions: d.addressed.mentions,
            assignees: d.addressed.assignees,
            reviewers: d.addressed.reviewers,
            channel: d.addressed.channel,
            thread: d.addressed.thread,
        },
        text: d.text,
        payload: d.payload,
        owed: d.owed.map(|o| ReplyTo {
            channel: o.channel,
            thread: o.thread,
        }),
        sender: Vec::new(),
        wakes: Wakes::RouteAndNamed,
        message: None,
    }
}
