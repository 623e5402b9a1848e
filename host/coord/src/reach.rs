//! A stream is open only once a write through this connection reaches it.
//!
//! Why: on a cluster, creating or finding a stream answers as soon as the
//! meta group has it, but a publish is routed by subject interest, which
//! the stream leader's server announces to the other members over the
//! routes a moment later. Until a member has heard, a write through it
//! finds no one listening and is answered "no responders" — a fresh-clone
//! CI run saw the first write after opening buckets on a 3-node cluster fail
//! with `no stream found for given subject`, for buckets that existed.
//!
//! So opening a stream (a bucket, an event stream, a module's bucket) ends
//! with [`until_writable`]: a publish the stream is bound to refuse — it
//! expects a last sequence no stream has — sent through the node's own
//! connection until the stream itself answers. The refusal proves the route
//! and stores nothing. No answer within the bound is an error that says so,
//! never a stream reported open that a write cannot reach.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishErrorKind};
use tokio::time::Instant;

/// How long opening waits for the route by default.
pub const REACH_WITHIN: Duration = Duration::from_secs(10);

/// The header of the probe: a last sequence no stream ever has.
const EXPECTED_LAST_SEQUENCE: &str = "Nats-Expected-Last-Sequence";

/// A stream a write through this connection did not reach.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "stream {stream} exists, but a write to {subject} through this node's connection did not reach it within {within:?} (last answer: {last}); the cluster may still be electing the stream's leader, or the routes to its leader are down"
)]
pub struct Unreachable {
    pub stream: String,
    pub subject: String,
    pub within: Duration,
    pub last: String,
}

/// Returns once a publish to `subject` through `js` is answered by the
/// stream `stream` that binds it, or fails after `within`.
pub async fn until_writable(
    js: &jetstream::Context,
    stream: &str,
    subject: &str,
    within: Duration,
) -> Result<(), Unreachable> {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        let last = match probe(js, subject).await {
            Probe::Answered => return Ok(()),
            Probe::NotYet(why) => why,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Unreachable {
                stream: stream.to_owned(),
                subject: subject.to_owned(),
                within,
                last,
            });
        }
        tracing::debug!(
            stream,
            subject,
            last,
            "stream not reachable yet; probing again"
        );
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

enum Probe {
    /// The stream answered (with the refusal the probe asks for).
    Answered,
    /// Nobody answered, or the request failed on the way.
    NotYet(String),
}

async fn probe(js: &jetstream::Context, subject: &str) -> Probe {
    let mut headers = HeaderMap::new();
    headers.insert(EXPECTED_LAST_SEQUENCE, u64::MAX.to_string().as_str());
    let ack = match js
        .publish_with_headers(subject.to_owned(), headers, bytes::Bytes::new())
        .await
    {
        Ok(ack) => ack,
        Err(e) => return Probe::NotYet(e.to_string()),
    };
    match ack.await {
        // Only the stream knows its last sequence: its refusal is the proof.
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Probe::Answered,
        // Unreachable in practice (no stream has that last sequence); a
        // stored probe would prove the route all the same.
        Ok(_) => Probe::Answered,
        Err(e) => Probe::NotYet(e.to_string()),
    }
}
