//! The company chat (`docs/chat.md`): secret `chat_signing_secret`.
//!
//! `X-Chat-Signature: v1=<hex>` is an HMAC-SHA256 of `v1:<ts>:<body>`,
//! `<ts>` being `X-Chat-Timestamp` (Unix seconds), refused more than five
//! minutes from now either way, as Slack's is. The node signs each message
//! it stored and hands it to its own edge; anything else that knows the
//! secret may post the same way.
//!
//! The body is the stored message (`{"id","channel","thread","author",
//! "text","at_ms"}`): one delivery, its id the message's id (so a message
//! handed in twice is claimed once), its `@handle` mentions whom it wakes,
//! its author the `sender` (a seat's own message never wakes it, and wakes
//! no follower: seats do not wake each other by talking in a thread), its
//! thread the conversation (a top-level message opens its own thread), and
//! a reply owed there. A message wakes only whom it names and who follows
//! its thread: the chat has no route's seat.

use serde::Deserialize;

use crate::{Addressed, Delivery, Input, ParseError, Parsed, VerifyError, Wakes, decode_hex};

/// The signing secret's name.
pub const SECRET: &str = "chat_signing_secret";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-chat-signature";
/// The signed timestamp's header.
pub const TIMESTAMP_HEADER: &str = "x-chat-timestamp";
/// How far the signed timestamp may be from now, in seconds, either way.
pub const WINDOW_SECONDS: i64 = 5 * 60;

/// Checks the v1 signature and the timestamp window.
pub fn verify(input: &Input<'_>) -> Result<(), VerifyError> {
    let secret = input.require_secret(SECRET)?;
    let timestamp_text = input.require_header(TIMESTAMP_HEADER)?;
    let header = input.require_header(SIGNATURE_HEADER)?;
    let timestamp: i64 = timestamp_text
        .trim()
        .parse()
        .map_err(|_| VerifyError::MalformedHeader(TIMESTAMP_HEADER.to_string()))?;
    let signature = header
        .strip_prefix("v1=")
        .and_then(decode_hex)
        .filter(|s| s.len() == 32)
        .ok_or_else(|| VerifyError::MalformedHeader(SIGNATURE_HEADER.to_string()))?;
    if (input.now_unix_seconds - timestamp).abs() > WINDOW_SECONDS {
        return Err(VerifyError::StaleTimestamp(timestamp));
    }
    let parts: [&[u8]; 4] = [b"v1:", timestamp_text.as_bytes(), b":", input.body];
    if crate::hmac_sha256_verify(secret, &parts, &signature) {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// The signature header's value for `body` at `timestamp`, under `secret`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let parts: [&[u8]; 4] = [b"v1:", ts.as_bytes(), b":", body];
    let mac = crate::hmac_sha256(secret, &parts);
    let mut out = String::with_capacity(3 + 64);
    out.push_str("v1=");
    for b in mac {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[derive(Deserialize)]
struct Message {
    id: String,
    channel: String,
    thread: Option<String>,
    author: String,
    text: String,
}

/// Parses one stored message into its delivery.
pub fn parse(input: &Input<'_>) -> Result<Parsed, ParseError> {
    let m: Message = crate::parse_json_as(input.body)?;
    for (field, value) in [
        ("id", &m.id),
        ("channel", &m.channel),
        ("author", &m.author),
    ] {
        if value.is_empty() {
            return Err(ParseError::MissingField(field.to_string()));
        }
    }
    let thread = m.thread.clone().unwrap_or_else(|| m.id.clone());
    let addressed = Addressed {
        mentions: crate::at_mentions(&m.text),
        channel: Some(m.channel.clone()),
        thread: Some(thread),
        ..Addressed::default()
    };
    Ok(Parsed {
        deliveries: vec![Delivery {
            source: "chat".to_string(),
            event_type: "message".to_string(),
            delivery_id: m.id.clone(),
            owed: addressed.reply_here(),
            addressed,
            text: Some(m.text),
            payload: input.body.to_vec(),
            sender: vec![m.author],
            wakes: Wakes::Named,
            message: Some(m.id),
        }],
        reply: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"id":"0001733490000123-ana-1a2b3c4d","channel":"general","thread":null,"author":"ana","text":"@grace hello, and @ada.","at_ms":1733490000123}"#;

    fn input<'a>(
        headers: &'a [(&'a str, &'a str)],
        secrets: &'a [(&'a str, &'a [u8])],
        now: i64,
    ) -> Input<'a> {
        Input {
            route: "/webhooks/chat",
            headers,
            body: BODY,
            secrets,
            now_unix_seconds: now,
        }
    }

    #[test]
    fn a_signed_message_verifies_and_a_changed_one_does_not() {
        let sig = sign(b"s3cret", 1_000, BODY);
        let headers = [(SIGNATURE_HEADER, sig.as_str()), (TIMESTAMP_HEADER, "1000")];
        let right: [(&str, &[u8]); 1] = [(SECRET, b"s3cret")];
        let wrong: [(&str, &[u8]); 1] = [(SECRET, b"other")];
        assert_eq!(verify(&input(&headers, &right, 1_010)), Ok(()));
        assert_eq!(
            verify(&input(&headers, &wrong, 1_010)),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify(&input(&headers, &right, 1_000 + WINDOW_SECONDS + 1)),
            Err(VerifyError::StaleTimestamp(1_000))
        );
        let bad = [(SIGNATURE_HEADER, "v0=00"), (TIMESTAMP_HEADER, "1000")];
        assert_eq!(
            verify(&input(&bad, &right, 1_000)),
            Err(VerifyError::MalformedHeader(SIGNATURE_HEADER.into()))
        );
    }

    #[test]
    fn a_top_level_message_opens_its_own_thread_and_wakes_whom_it_names() {
        let parsed = parse(&input(&[], &[], 0)).unwrap();
        let d = &parsed.deliveries[0];
        assert_eq!(d.addressed.mentions, vec!["grace", "ada"]);
        assert_eq!(
            d.addressed.thread.as_deref(),
            Some("0001733490000123-ana-1a2b3c4d")
        );
        assert_eq!(d.sender, vec!["ana"]);
        assert_eq!(d.message.as_deref(), Some(d.delivery_id.as_str()));
        assert_eq!(d.wakes, Wakes::Named);
        assert_eq!(d.owed.as_ref().map(|o| o.channel.as_str()), Some("general"));
    }
}
