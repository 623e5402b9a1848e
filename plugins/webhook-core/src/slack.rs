//! Slack: signing secret v0 (secret `slack_signing_secret`).
//!
//! `X-Slack-Signature: v0=<hex>` is an HMAC-SHA256 of `v0:<ts>:<body>` where
//! `<ts>` is `X-Slack-Request-Timestamp`. A timestamp more than five minutes
//! from now, in either direction, is refused: Slack's own guidance against
//! replays, and a clock far ahead is as suspect as one behind.
//!
//! Parsing handles the Events API (JSON): `url_verification` yields no
//! delivery and a reply carrying the challenge; `event_callback` yields one
//! delivery. Slash commands (form-encoded) yield one `slash_command`.
//!
//! Whom an event may wake ([`wakes`]): Slack sends an app its mentions
//! (`app_mention`), its direct messages (`channel_type` `im`) and its
//! slash commands — those wake the seat whose route it is; every other
//! message it sees in a channel it watches wakes only whom it names; an
//! edit, a deletion, a join, a topic change, a reaction, or any event that
//! is no message a person wrote, wakes nobody. The author's ids (`user`,
//! `bot_id`, `app_id`) are the delivery's `sender`, so a seat's own reply,
//! heard back, never wakes it.

use crate::json::{first_string, string_at};
use crate::{Addressed, Delivery, Input, ParseError, Parsed, Reply, VerifyError, Wakes};

/// The signing secret's name.
pub const SECRET: &str = "slack_signing_secret";
/// How far the signed timestamp may be from now, in seconds, either way.
pub const WINDOW_SECONDS: i64 = 5 * 60;

const SIGNATURE_HEADER: &str = "x-slack-signature";
const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";

/// Checks the v0 signature and the timestamp window.
pub fn verify(input: &Input<'_>) -> Result<(), VerifyError> {
    crate::Versioned {
        secret: SECRET,
        version: "v0",
        signature_header: SIGNATURE_HEADER,
        timestamp_header: TIMESTAMP_HEADER,
        window_seconds: WINDOW_SECONDS,
    }
    .verify(input)
}

/// Whether the sender of an event of this type waits for an answer in the
/// same place: a mention, or a message.
fn conversational(event_type: &str) -> bool {
    event_type.starts_with("app_mention") || event_type.starts_with("message")
}

/// Message subtypes a person (or an app) wrote: a conversation.
const WRITTEN: [&str; 4] = [
    "bot_message",
    "thread_broadcast",
    "file_share",
    "me_message",
];

/// Whom an event of `event_type` (`subtype`, in a channel of
/// `channel_type`) may wake: see the module docs.
pub fn wakes(event_type: &str, subtype: Option<&str>, channel_type: Option<&str>) -> Wakes {
    match (event_type, subtype) {
        ("app_mention", _) => Wakes::RouteAndNamed,
        ("message", None) => match channel_type {
            Some("im") => Wakes::RouteAndNamed,
            _ => Wakes::Named,
        },
        ("message", Some(sub)) if WRITTEN.contains(&sub) => match channel_type {
            Some("im") => Wakes::RouteAndNamed,
            _ => Wakes::Named,
        },
        ("message", Some(sub)) => {
            let what = match sub {
                "message_changed" => "an edit",
                "message_deleted" => "a deletion",
                "channel_join" | "group_join" => "a join",
                "channel_leave" | "group_leave" => "a leave",
                "channel_topic" | "group_topic" => "a topic change",
                "channel_purpose" | "group_purpose" => "a purpose change",
                "channel_name" | "group_name" => "a rename",
                _ => "no message a person wrote",
            };
            Wakes::Nobody(format!("a `message` of subtype `{sub}`: {what}"))
        }
        ("reaction_added" | "reaction_removed", _) => {
            Wakes::Nobody(format!("a `{event_type}` event: a reaction, not a message"))
        }
        ("member_joined_channel" | "member_left_channel", _) => Wakes::Nobody(format!(
            "a `{event_type}` event: a join or leave, not a message"
        )),
        _ => Wakes::Nobody(format!("a `{event_type}` event is not a message")),
    }
}

/// The author's ids as Slack sent them: user, bot and app, each once.
fn author(payload: &serde_json::Value) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for path in [
        &["event", "user"][..],
        &["event", "bot_id"],
        &["event", "app_id"],
        &["event", "bot_profile", "app_id"],
    ] {
        if let Some(id) = string_at(payload, path)
            && !ids.contains(&id)
        {
            ids.push(id);
        }
    }
    ids
}

/// The message an event is one copy of (`CHANNEL:TS`), for a
/// conversational event: Slack sends an app both an `app_mention` and a
/// `message` for one post that mentions it, and every app in the channel
/// its own `message` (each with its own event id), so a seat is woken once
/// per post only if they are known as one. Edits and other non-messages
/// are their own events.
fn message_of(event_type: &str, wakes: &Wakes, payload: &serde_json::Value) -> Option<String> {
    if !conversational(event_type) || matches!(wakes, Wakes::Nobody(_)) {
        return None;
    }
    let channel = string_at(payload, &["event", "channel"])?;
    let ts = string_at(payload, &["event", "ts"])?;
    Some(format!("{channel}:{ts}"))
}

/// Parses an Events API body or a slash command.
pub fn parse(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let trimmed = input.body.iter().position(|b| !b.is_ascii_whitespace());
    if trimmed.is_some_and(|i| input.body[i] == b'{') {
        parse_event(input)
    } else {
        parse_command(input)
    }
}

fn parse_event(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let payload = crate::parse_json(input.body)?;
    let kind = string_at(&payload, &["type"])
        .ok_or_else(|| ParseError::MissingField("type".to_string()))?;
    match kind.as_str() {
        "url_verification" => {
            let challenge = string_at(&payload, &["challenge"])
                .ok_or_else(|| ParseError::MissingField("challenge".to_string()))?;
            Ok(Parsed {
                deliveries: Vec::new(),
                reply: Some(Reply {
                    content_type: "text/plain".to_string(),
                    body: challenge.into_bytes(),
                }),
            })
        }
        "event_callback" => {
            let event_type = string_at(&payload, &["event", "type"])
                .ok_or_else(|| ParseError::MissingField("event.type".to_string()))?;
            let delivery_id = string_at(&payload, &["event_id"])
                .ok_or_else(|| ParseError::MissingField("event_id".to_string()))?;
            let text = string_at(&payload, &["event", "text"]);
            let wakes = wakes(
                &event_type,
                string_at(&payload, &["event", "subtype"]).as_deref(),
                string_at(&payload, &["event", "channel_type"]).as_deref(),
            );
            let message = message_of(&event_type, &wakes, &payload);
            let addressed = Addressed {
                mentions: text.as_deref().map(user_mentions).unwrap_or_default(),
                channel: string_at(&payload, &["event", "channel"]),
                thread: first_string(&payload, &[&["event", "thread_ts"], &["event", "ts"]]),
                ..Addressed::default()
            };
            Ok(Parsed {
                deliveries: vec![Delivery {
                    source: "slack".to_string(),
                    owed: (conversational(&event_type) && !matches!(wakes, Wakes::Nobody(_)))
                        .then(|| addressed.reply_here())
                        .flatten(),
                    event_type,
                    delivery_id,
                    addressed,
                    text,
                    payload: input.body.to_vec(),
                    sender: author(&payload),
                    message,
                    wakes,
                }],
                reply: None,
            })
        }
        // A notice without an event id (`app_rate_limited`, …) names no
        // delivery the fleet could claim once: verified, nothing to do.
        other => Ok(Parsed {
            deliveries: string_at(&payload, &["event_id"])
                .map(|delivery_id| Delivery {
                    source: "slack".to_string(),
                    event_type: other.to_string(),
                    delivery_id,
                    addressed: Addressed::default(),
                    text: None,
                    payload: input.body.to_vec(),
                    owed: None,
                    sender: Vec::new(),
                    wakes: Wakes::Nobody(format!("a `{other}` notice is not a message")),
                    message: None,
                })
                .into_iter()
                .collect(),
            reply: None,
        }),
    }
}

fn parse_command(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let body = std::str::from_utf8(input.body)
        .map_err(|_| ParseError::MalformedBody("form body is not UTF-8".to_string()))?;
    let fields = form_fields(body)
        .ok_or_else(|| ParseError::MalformedBody("form body has a bad %-escape".to_string()))?;
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let command =
        field("command").ok_or_else(|| ParseError::MissingField("command".to_string()))?;
    let trigger =
        field("trigger_id").ok_or_else(|| ParseError::MissingField("trigger_id".to_string()))?;
    let text = field("text").filter(|t| !t.is_empty());
    Ok(Parsed {
        deliveries: vec![Delivery {
            source: "slack".to_string(),
            event_type: format!("slash_command{command}"),
            delivery_id: trigger,
            addressed: Addressed {
                mentions: text.as_deref().map(user_mentions).unwrap_or_default(),
                channel: field("channel_id"),
                ..Addressed::default()
            },
            text,
            payload: input.body.to_vec(),
            owed: None,
            // A command is sent to the app whose route it is.
            sender: field("user_id").into_iter().collect(),
            wakes: Wakes::RouteAndNamed,
            message: None,
        }],
        reply: None,
    })
}

/// Slack's `<@U123>` / `<@U123|name>` mentions, as user ids (exactly as
/// Slack sends them, so they match a seat's `identities.slack`). A mention
/// whose id is not one word of letters and digits, or that is not closed
/// by `>` (a truncated or mangled message), names nobody.
pub fn user_mentions(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("<@") {
        let after = &rest[start + 2..];
        let id_len = after.bytes().take_while(u8::is_ascii_alphanumeric).count();
        let id = &after[..id_len];
        let tail = &after[id_len..];
        let closed = match tail.as_bytes().first() {
            Some(b'>') => true,
            // A label runs to `>`, and holds no other mention.
            Some(b'|') => tail
                .find(['>', '<'])
                .is_some_and(|end| tail.as_bytes()[end] == b'>'),
            _ => false,
        };
        if closed && !id.is_empty() && !out.iter().any(|m| m == id) {
            out.push(id.to_string());
        }
        rest = tail;
    }
    out
}

fn form_fields(body: &str) -> Option<Vec<(String, String)>> {
    body.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((percent_decode(k)?, percent_decode(v)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_and_form_decoding() {
        assert_eq!(
            user_mentions("hi <@U1> and <@U2|bob> <@U1>"),
            vec!["U1", "U2"]
        );
        // Malformed or truncated: nobody, and what follows still counts.
        assert!(user_mentions("<@U04ABCDEF").is_empty());
        assert!(user_mentions("<@U04ABCDEF|ada").is_empty());
        assert!(user_mentions("<@> <@ U1> <@U1 x> <@U1\u{e9}>").is_empty());
        assert_eq!(user_mentions("<@U1|a <@U2> <@W3|x>"), vec!["U2", "W3"]);
        assert!(user_mentions("<!channel> <!subteam^S1|@eng> <#C1|general>").is_empty());
        assert_eq!(percent_decode("%2Fwebbot+x").as_deref(), Some("/webbot x"));
        assert_eq!(percent_decode("%2"), None);
    }

    fn event(event: serde_json::Value) -> Delivery {
        let body = serde_json::json!({
            "type": "event_callback", "event_id": "Ev1", "team_id": "T1", "event": event,
        })
        .to_string();
        let input = Input {
            route: "/webhooks/slack/ada",
            headers: &[],
            body: body.as_bytes(),
            secrets: &[],
            now_unix_seconds: 0,
        };
        let mut parsed = parse(&input).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(parsed.deliveries.len(), 1);
        parsed.deliveries.remove(0)
    }

    #[test]
    fn the_mention_and_the_message_of_one_post_are_one_message() {
        let post = |kind: &str| {
            event(serde_json::json!({"type": kind, "channel_type": "channel",
            "user": "U07GRACE1", "text": "<@U04ADA> hi", "channel": "C1", "ts": "7.1"}))
        };
        let (mention, message) = (post("app_mention"), post("message"));
        assert_eq!(mention.message.as_deref(), Some("C1:7.1"));
        assert_eq!(mention.message, message.message);
        let reply = event(serde_json::json!({"type": "message", "user": "U07GRACE1",
            "text": "more", "channel": "C1", "ts": "7.2", "thread_ts": "7.1"}));
        assert_eq!(
            reply.message.as_deref(),
            Some("C1:7.2"),
            "a reply is its own message"
        );
        let edit = event(
            serde_json::json!({"type": "message", "subtype": "message_changed",
            "channel": "C1", "ts": "7.3", "message": {"text": "edited"}}),
        );
        assert_eq!(edit.message, None);
    }

    #[test]
    fn only_what_is_sent_to_the_app_wakes_its_route_and_noise_wakes_nobody() {
        let lunch = event(
            serde_json::json!({"type": "message", "channel_type": "channel",
            "user": "U07GRACE1", "text": "lunch anyone?", "channel": "C1", "ts": "1.1"}),
        );
        assert_eq!(lunch.wakes, Wakes::Named);
        assert_eq!(lunch.sender, ["U07GRACE1"]);
        let dm = event(serde_json::json!({"type": "message", "channel_type": "im",
            "user": "U07GRACE1", "text": "are you there?", "channel": "D1", "ts": "1.2"}));
        assert_eq!(dm.wakes, Wakes::RouteAndNamed);
        assert!(dm.owed.is_some());
        let mention = event(
            serde_json::json!({"type": "app_mention", "user": "U07GRACE1",
            "text": "<@U04ADA> hi", "channel": "C1", "ts": "1.3"}),
        );
        assert_eq!(mention.wakes, Wakes::RouteAndNamed);
        // The seat's own reply, heard back: its bot's ids are the sender.
        let own = event(
            serde_json::json!({"type": "message", "channel_type": "channel",
            "user": "U04ADA", "bot_id": "B04ADA", "app_id": "A04ADA",
            "bot_profile": {"app_id": "A04ADA"}, "text": "on it", "channel": "C1", "ts": "1.4"}),
        );
        assert_eq!(own.sender, ["U04ADA", "B04ADA", "A04ADA"]);
        assert_eq!(own.wakes, Wakes::Named);
        for (noise, why) in [
            (
                serde_json::json!({"type": "message", "subtype": "message_changed", "channel": "C1",
                "message": {"user": "U07GRACE1", "text": "lunch, anyone?"}, "ts": "1.5"}),
                "an edit",
            ),
            (
                serde_json::json!({"type": "message", "subtype": "channel_join", "user": "U07GRACE1",
                "text": "<@U07GRACE1> has joined the channel", "channel": "C1", "ts": "1.6"}),
                "a join",
            ),
            (
                serde_json::json!({"type": "message", "subtype": "channel_topic", "user": "U07GRACE1",
                "text": "set the topic", "channel": "C1", "ts": "1.7"}),
                "a topic change",
            ),
            (
                serde_json::json!({"type": "reaction_added", "user": "U07GRACE1", "reaction": "thumbsup",
                "item": {"type": "message", "channel": "C1", "ts": "1.1"}}),
                "a reaction",
            ),
            (
                serde_json::json!({"type": "channel_rename", "channel": {"id": "C1", "name": "x"}}),
                "not a message",
            ),
        ] {
            let d = event(noise);
            match &d.wakes {
                Wakes::Nobody(reason) => assert!(reason.contains(why), "{reason}"),
                other => panic!("{why}: {other:?}"),
            }
            assert_eq!(d.owed, None, "{why}: nobody waits for an answer");
        }
    }
}
