//! Publishing to a stream and waiting for its acknowledgement, one way for
//! every caller (the event broadcast, the webhook edge, `notify-inbound`).
//!
//! The rule: a publish that a caller's promise rests on (a 2xx to a sender,
//! the ack of the message it came from, an event reported as broadcast)
//! counts only once the stream acknowledged it, and the wait is bounded: a
//! stream without a leader never answers, and a caller holding a request
//! cannot wait for ever. The bound is the caller's; [`ACK_TIMEOUT`] is the
//! node's.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishAckFuture, PublishError};
use async_nats::jetstream::{self, publish::PublishAck};
use async_nats::subject::ToSubject;

/// How long a publish waits for the stream's acknowledgement.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a publish did not count.
#[derive(Debug, thiserror::Error)]
pub enum AckError {
    #[error("the NATS client did not send the message ({0}); check the node's connection")]
    Send(#[source] PublishError),
    #[error("the stream did not take the message ({0}); check that it exists and has a leader")]
    Ack(#[source] PublishError),
    #[error("no acknowledgement within {0:?}; the stream may have no leader, retry later")]
    Timeout(Duration),
}

/// Publishes `body` with `headers` (none when empty) on `subject` and waits
/// up to `within` for the stream's acknowledgement.
pub async fn publish_acked(
    js: &jetstream::Context,
    subject: impl ToSubject,
    headers: HeaderMap,
    body: Vec<u8>,
    within: Duration,
) -> Result<PublishAck, AckError> {
    let ack = js
        .publish_with_headers(subject, headers, body.into())
        .await
        .map_err(AckError::Send)?;
    await_ack(ack, within).await
}

/// Waits up to `within` for an acknowledgement already asked for.
pub async fn await_ack(ack: PublishAckFuture, within: Duration) -> Result<PublishAck, AckError> {
    match tokio::time::timeout(within, ack).await {
        Ok(Ok(ack)) => Ok(ack),
        Ok(Err(e)) => Err(AckError::Ack(e)),
        Err(_) => Err(AckError::Timeout(within)),
    }
}
