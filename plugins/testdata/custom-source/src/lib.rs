//! Test data: a third-party webhook source, written as an author outside
//! this repository would write one (the WIT and `wit-bindgen`, no Crewlet
//! SDK). A shared token in `x-tickets-token` is compared in constant time
//! with the secret `custom_token`; the body is one ticket event as JSON:
//! `{"id", "kind", "to", "text", "asks", "channel", "thread"}`. The ticket
//! is addressed to `to` in the channel `tickets`, thread `id`; when `asks`
//! is true a person waits for an answer at `channel`/`thread`, and the
//! delivery says so (`owed`). Every parse says what it made of the ticket
//! through `log`, and a word on stderr.

wit_bindgen::generate!({ world: "webhook", path: "../../../wit" });

use crewlet::plugin::log::{self, Level};
use exports::crewlet::plugin::inbound::{
    Addressed, Delivery, Guest, ParseError, Parsed, ReplyTo, Request, VerifyError, Wakes,
};

const TOKEN_HEADER: &str = "x-tickets-token";
const SECRET: &str = "custom_token";

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn field(v: &serde_json::Value, name: &str) -> Result<String, ParseError> {
    v[name]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| ParseError::MissingField(name.to_string()))
}

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        let secret = req
            .secrets
            .iter()
            .find(|s| s.name == SECRET)
            .ok_or_else(|| VerifyError::MissingSecret(SECRET.into()))?;
        let token = req
            .headers
            .iter()
            .find(|h| h.name == TOKEN_HEADER)
            .ok_or_else(|| VerifyError::MissingHeader(TOKEN_HEADER.into()))?;
        if constant_time_eq(token.value.as_bytes(), &secret.value) {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        let v: serde_json::Value = serde_json::from_slice(&req.body)
            .map_err(|_| ParseError::MalformedBody("the body is not JSON".into()))?;
        let id = field(&v, "id")?;
        let kind = field(&v, "kind")?;
        let to = field(&v, "to")?;
        let asks = v["asks"].as_bool().unwrap_or(false);
        let owed = if asks {
            Some(ReplyTo {
                channel: field(&v, "channel")?,
                thread: v["thread"].as_str().map(str::to_string),
            })
        } else {
            None
        };
        log::write(
            Level::Info,
            &format!(
                "ticket {id}: {kind} for {to}, reply owed: {}",
                owed.as_ref()
                    .map(|o| format!("{}#{}", o.channel, o.thread.as_deref().unwrap_or("-")))
                    .unwrap_or_else(|| "no".into())
            ),
        );
        eprintln!("custom-source parsed ticket {id}");
        Ok(Parsed {
            deliveries: vec![Delivery {
                source: "tickets".into(),
                event_type: kind,
                delivery_id: id.clone(),
                addressed: Addressed {
                    mentions: vec![to],
                    assignees: Vec::new(),
                    reviewers: Vec::new(),
                    channel: Some("tickets".into()),
                    thread: Some(id),
                },
                text: v["text"].as_str().map(str::to_string),
                payload: req.body,
                owed,
                sender: Vec::new(),
                wakes: Wakes::RouteAndNamed,
                message: None,
            }],
            reply: None,
        })
    }
}

export!(Plugin);
