//! Mailboxes: a durable consumer per seat on its inbox subject
//! (`crewlet_bus::inbox_subject`) in `CREWLET_AGENT`.
//!
//! Every node creates one for every seat of the active company, whether or
//! not the seat runs anywhere: `CREWLET_AGENT` has interest retention, so a
//! wake published before its mailbox exists would be dropped. Each is
//! recorded in the mailboxes bucket *before* it is created, so a consumer
//! the fleet does not know about never exists. Both steps are idempotent.

use async_nats::jetstream::{self, consumer};
use crewlet_bus::{AGENT_STREAM, inbox_subject, mailbox_durable};
use crewlet_coord::{Bucket, Coord};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    #[error("cannot record mailbox {handle} in the mailboxes bucket: {detail}")]
    Record { handle: String, detail: String },
    #[error("cannot open stream {AGENT_STREAM}: {0}")]
    Stream(String),
    #[error("cannot create mailbox consumer {durable}: {detail}")]
    Consumer { durable: String, detail: String },
}

/// Records and creates the mailbox of every seat in `handles` (a company's
/// handles); answers how many there are.
pub async fn ensure_mailboxes<'a>(
    js: &jetstream::Context,
    coord: &Coord,
    handles: impl IntoIterator<Item = &'a str>,
) -> Result<usize, MailboxError> {
    let stream = js
        .get_stream(AGENT_STREAM)
        .await
        .map_err(|e| MailboxError::Stream(e.to_string()))?;
    let mut count = 0;
    for h in handles {
        let durable = mailbox_durable(h);
        let subject = inbox_subject(h);
        coord
            .put_record(
                Bucket::Mailboxes,
                "mailbox",
                h,
                &json!({ "durable": durable, "stream": AGENT_STREAM, "subject": subject }),
            )
            .await
            .map_err(|e| MailboxError::Record {
                handle: h.to_owned(),
                detail: e.to_string(),
            })?;
        stream
            .get_or_create_consumer(
                &durable,
                consumer::pull::Config {
                    durable_name: Some(durable.clone()),
                    filter_subject: subject,
                    ack_policy: consumer::AckPolicy::Explicit,
                    description: Some(format!("mailbox of seat {h}")),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| MailboxError::Consumer {
                durable: durable.clone(),
                detail: e.to_string(),
            })?;
        count += 1;
    }
    Ok(count)
}
