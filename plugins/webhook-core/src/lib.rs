//! Verification and parsing for Crewlet's webhook plugins.
//!
//! Plain Rust with no WIT in sight, so the same code runs inside the
//! components (through thin adapters in `plugins/webhooks/*`) and natively
//! (unit tests, and the host's benchmark that compares the two).
//!
//! Rules every source follows:
//! - Signatures and tokens are compared in constant time (`subtle`, or
//!   `hmac`'s own `verify_slice`), so timing says nothing about the secret.
//! - A malformed header is a [`VerifyError`], never a panic: every decode is
//!   checked and every index is bounds-checked.
//! - Parsing never fails on an unknown event type; it yields a delivery with
//!   the type as the source named it, so new events reach routing unchanged.
//! - A delivery is `owed` a reply only where a person waits for an answer
//!   in the place it came from (a mention in a thread, a comment on an
//!   issue); an assignment, a review request or an alert asks for work.
//!   Each source says which of its event types those are.
//! - A delivery names its author's ids as the vendor sent them (`sender`),
//!   and whom it may wake (`wakes`): a source that signs each seat's app
//!   apart (Slack) says which events were sent to that app and which it
//!   only saw; an event that is no conversation wakes nobody.

pub mod atlassian;
pub mod chat;
pub mod datadog;
pub mod github;
pub mod gitlab;
pub mod slack;

mod crypto;
mod json;

#[cfg(feature = "component")]
pub mod component;

pub use crypto::{constant_time_eq, decode_hex, hmac_sha256, hmac_sha256_verify};

/// One delivery as the ingress received it, borrowed from the caller.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub route: &'a str,
    /// Header names are lower-case.
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
    pub secrets: &'a [(&'a str, &'a [u8])],
    pub now_unix_seconds: i64,
}

impl<'a> Input<'a> {
    /// The first header with this (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&'a str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// A required header, or [`VerifyError::MissingHeader`].
    pub fn require_header(&self, name: &str) -> Result<&'a str, VerifyError> {
        self.header(name)
            .ok_or_else(|| VerifyError::MissingHeader(name.to_string()))
    }

    /// The secret the host resolved under `name`.
    pub fn secret(&self, name: &str) -> Option<&'a [u8]> {
        self.secrets
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// A required secret, or [`VerifyError::MissingSecret`].
    pub fn require_secret(&self, name: &str) -> Result<&'a [u8], VerifyError> {
        self.secret(name)
            .ok_or_else(|| VerifyError::MissingSecret(name.to_string()))
    }
}

/// Why a delivery was refused; mirrors the WIT `verify-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    MissingHeader(String),
    MalformedHeader(String),
    Mismatch,
    StaleTimestamp(i64),
    MissingSecret(String),
}

/// Why a verified delivery could not be parsed; mirrors the WIT `parse-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    MalformedBody(String),
    MissingField(String),
}

/// Who a delivery is addressed to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addressed {
    pub mentions: Vec<String>,
    pub assignees: Vec<String>,
    pub reviewers: Vec<String>,
    pub channel: Option<String>,
    pub thread: Option<String>,
}

impl Addressed {
    /// A reply owed where the delivery came from: its channel and thread
    /// (none without a channel: there is nowhere to answer).
    pub fn reply_here(&self) -> Option<ReplyTo> {
        Some(ReplyTo {
            channel: self.channel.clone()?,
            thread: self.thread.clone(),
        })
    }
}

/// Where a person waits for an answer; mirrors the WIT `reply-to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTo {
    pub channel: String,
    pub thread: Option<String>,
}

/// One normalised delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub source: String,
    pub event_type: String,
    pub delivery_id: String,
    pub addressed: Addressed,
    pub text: Option<String>,
    pub payload: Vec<u8>,
    /// Set when a person waits for an answer, and where.
    pub owed: Option<ReplyTo>,
    /// Every id the vendor gave the author, as sent (Slack: user, bot and
    /// app ids); empty when it names none.
    pub sender: Vec<String>,
    /// Whom it may wake; mirrors the WIT `wakes`.
    pub wakes: Wakes,
    /// The message this delivery is one copy of, when the vendor sends
    /// one message as several events; mirrors the WIT `message`.
    pub message: Option<String>,
}

/// Whom a delivery may wake; mirrors the WIT `wakes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wakes {
    /// Its route's seat (the vendor sent it to that seat's app alone) and
    /// whom it names.
    RouteAndNamed,
    /// Only whom it names: the app saw it in a channel it watches.
    Named,
    /// Nobody: not a conversation; why.
    Nobody(String),
}

/// A body to answer the sender with instead of an empty `200`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub content_type: String,
    pub body: Vec<u8>,
}

/// What parsing produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub deliveries: Vec<Delivery>,
    pub reply: Option<Reply>,
}

/// `@name` mentions in free text, in order of appearance, without
/// duplicates. A name is ASCII letters, digits, `-`, `_` and `.`, not ending
/// in `.` (so "ask @octocat." yields `octocat`); an `@` inside a word (an
/// e-mail address) is not a mention.
pub fn at_mentions(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out: Vec<String> = Vec::new();
    // memchr to the next `@`: a comment is kilobytes of prose with a mention
    // or two, and a byte-at-a-time loop over it was half of a GitHub parse
    // in the guest.
    for at in memchr::memchr_iter(b'@', bytes) {
        if at > 0 && is_name_byte(bytes[at - 1]) {
            continue;
        }
        let start = at + 1;
        let mut end = start;
        while end < bytes.len() && is_name_byte(bytes[end]) {
            end += 1;
        }
        while end > start && bytes[end - 1] == b'.' {
            end -= 1;
        }
        if end > start {
            let name = &text[start..end];
            if !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
        }
    }
    out
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'
}

/// Parses a JSON body, mapping failure to [`ParseError::MalformedBody`]
/// without echoing the body.
pub fn parse_json(body: &[u8]) -> Result<serde_json::Value, ParseError> {
    parse_json_as(body)
}

/// The body read as `T`: fields `T` does not name are skipped unbuilt.
pub fn parse_json_as<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ParseError> {
    serde_json::from_slice(body)
        .map_err(|e| ParseError::MalformedBody(format!("body is not JSON: {}", e.classify_name())))
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "read error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "unexpected data",
            serde_json::error::Category::Eof => "truncated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_skip_emails_and_trailing_dots() {
        assert_eq!(
            at_mentions("@alice ask @bob. mail a@b.c, @alice again, @-x"),
            vec!["alice", "bob", "-x"]
        );
        assert!(at_mentions("no one @").is_empty());
    }
}
