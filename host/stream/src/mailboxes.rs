//! Mailboxes: a durable consumer per seat on its inbox subject
//! (`crewlet_bus::inbox_subject`) in `CREWLET_AGENT`, and its record
//! ([`MailboxRecord`]) in the mailboxes bucket.
//!
//! Every node creates one for every seat of the active company, whether or
//! not the seat runs anywhere: `CREWLET_AGENT` has interest retention, so a
//! wake published before its mailbox exists would be dropped. Each is
//! recorded *before* it is created, so a consumer the fleet does not know
//! about never exists. Both steps are idempotent.
//!
//! Every change to a mailbox record is a compare-and-set at the revision
//! just read, never a blind put: two nodes (one ensuring a returning seat,
//! the maintenance duty retiring it) must not overwrite each other's word.
//! A seat gone from the company is first stamped absent, and only after a
//! grace period retired: its consumer deleted, its record marked. A seat
//! that returns is made active again by [`ensure_mailboxes`].

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream::ConsumerErrorKind};
use crewlet_bus::{AGENT_STREAM, inbox_subject, mailbox_durable};
use crewlet_coord::{Answer, CoordError, Records};
use serde::{Deserialize, Serialize};

/// The record class of mailboxes in [`Bucket::Mailboxes`].
pub const MAILBOX_CLASS: &str = "mailbox";

/// Reads and compare-and-sets one ensure makes before it gives up on a
/// record that keeps moving under it.
pub const ENSURE_ATTEMPTS: u32 = 4;

/// A seat's mailbox as the fleet records it. Keys this build does not know
/// are ignored when read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxRecord {
    pub durable: String,
    pub stream: String,
    pub subject: String,
    /// When the seat was first seen gone from the active company.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent_since_ms: Option<i64>,
    /// When its consumer was deleted (the seat stayed gone past the grace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at_ms: Option<i64>,
}

impl MailboxRecord {
    /// The active mailbox of `handle`, as this build names it.
    pub fn active(handle: &str) -> MailboxRecord {
        MailboxRecord {
            durable: mailbox_durable(handle),
            stream: AGENT_STREAM.to_owned(),
            subject: inbox_subject(handle),
            absent_since_ms: None,
            retired_at_ms: None,
        }
    }

    /// Neither stamped absent nor retired.
    pub fn is_active(&self) -> bool {
        self.absent_since_ms.is_none() && self.retired_at_ms.is_none()
    }

    fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a mailbox record serializes")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    #[error("cannot record mailbox {handle} in the mailboxes bucket: {detail}")]
    Record { handle: String, detail: String },
    #[error(
        "the mailbox record of {handle} moved under each of {attempts} compare-and-sets; another node is rewriting it — ensure again on the next company change or start"
    )]
    Contended { handle: String, attempts: u32 },
    #[error("cannot open stream {stream}: {detail}")]
    Stream { stream: String, detail: String },
    #[error("cannot create mailbox consumer {durable}: {detail}")]
    Consumer { durable: String, detail: String },
    #[error(
        "cannot list the mailbox records: {detail}; nothing was stamped or retired — the next maintenance tick tries again"
    )]
    List { detail: String },
    #[error(
        "cannot list the consumers of {stream}: {detail}; mailbox depths are unknown — retry shortly"
    )]
    Depths { stream: String, detail: String },
}

/// How much waits in one mailbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MailboxDepth {
    /// Wakes not yet delivered to the seat.
    pub pending: u64,
    /// Delivered and not yet acknowledged (a turn is working on them).
    pub in_work: u64,
}

/// Every consumer's depth on the agent stream, by durable name (a seat's
/// is [`crewlet_bus::mailbox_durable`]): one paged listing, not a request
/// per seat. A listing that fails is an error — never a short map.
pub async fn mailbox_depths(
    js: &jetstream::Context,
) -> Result<std::collections::BTreeMap<String, MailboxDepth>, MailboxError> {
    use futures::TryStreamExt;
    let depths = |e: &dyn std::fmt::Display| MailboxError::Depths {
        stream: AGENT_STREAM.to_owned(),
        detail: e.to_string(),
    };
    let stream = open_stream(js, AGENT_STREAM).await?;
    let mut out = std::collections::BTreeMap::new();
    let mut infos = std::pin::pin!(stream.consumers());
    while let Some(info) = infos.try_next().await.map_err(|e| depths(&e))? {
        out.insert(
            info.name.clone(),
            MailboxDepth {
                pending: info.num_pending,
                in_work: info.num_ack_pending as u64,
            },
        );
    }
    Ok(out)
}

/// What one retirement pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RetireReport {
    /// Handles stamped absent this pass.
    pub stamped: Vec<String>,
    /// Handles whose consumer was deleted and record retired this pass.
    pub retired: Vec<String>,
    /// Handles in the company whose record was stamped absent: made active
    /// again this pass.
    pub restored: Vec<String>,
    /// Handles left as they were (or half-way), with why ([`RetireError`]);
    /// the next pass looks at them again.
    pub failed: Vec<(String, String)>,
}

/// Why one handle was not stamped or retired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetireError {
    #[error(
        "lost the compare-and-set: the mailbox record moved since revision {revision}; the next pass reads it again"
    )]
    Moved { revision: u64 },
    #[error(
        "the coordination store did not answer ({0}); the record may or may not have changed — the next pass reads it again"
    )]
    Store(String),
    #[error("the record does not decode ({0}); it is left as it is")]
    Undecodable(String),
    #[error(
        "cannot delete consumer {durable} on {stream}: {detail}; the record stays stamped and the next pass tries again"
    )]
    DeleteConsumer {
        durable: String,
        stream: String,
        detail: String,
    },
    #[error(
        "the seat came back while it was retired (the record moved since revision {revision}); its consumer was created again"
    )]
    CameBack { revision: u64 },
    #[error(
        "the seat may have come back while it was retired (the record moved since revision {revision}) and its consumer could not be checked or created again ({detail}); ensure the company's mailboxes again"
    )]
    CameBackUnrestored { revision: u64, detail: String },
}

/// Records and creates the mailbox of every seat in `handles` (a company's
/// handles); answers how many there are. A record already active is left
/// unwritten; one stamped absent, retired or named differently is made
/// active by compare-and-set (and its consumer created again).
pub async fn ensure_mailboxes<'a>(
    js: &jetstream::Context,
    records: &Records,
    handles: impl IntoIterator<Item = &'a str>,
) -> Result<usize, MailboxError> {
    let stream = open_stream(js, AGENT_STREAM).await?;
    let mut count = 0;
    for h in handles {
        let want = MailboxRecord::active(h);
        record_active(records, h, &want).await?;
        open_consumer(&stream, h, &want).await?;
        count += 1;
    }
    Ok(count)
}

/// Stamps absent every recorded mailbox whose handle is not in `active`,
/// and retires each stamped more than `grace` before `now_ms`: deletes its
/// durable consumer (one already gone is fine), then marks the record. One
/// handle's failure never stops the others; a lost compare-and-set is
/// reported, never retried in this pass. Err only when the records could
/// not be listed (nothing was done).
pub async fn retire_mailboxes(
    js: &jetstream::Context,
    records: &Records,
    active: &BTreeSet<String>,
    now_ms: i64,
    grace: Duration,
) -> Result<RetireReport, MailboxError> {
    let listed = records
        .list_records_with_revisions(MAILBOX_CLASS)
        .await
        .map_err(|e| MailboxError::List {
            detail: e.to_string(),
        })?;
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let mut report = RetireReport::default();
    for (handle, (value, revision)) in listed {
        let rec: MailboxRecord = match serde_json::from_value(value) {
            Ok(r) => r,
            Err(e) => {
                if !active.contains(&handle) {
                    let why = RetireError::Undecodable(e.to_string());
                    report.failed.push((handle, why.to_string()));
                }
                continue;
            }
        };
        if active.contains(&handle) {
            // Stamped by a pass that ran on a company without it (a holder
            // a revision behind the fleet): the seat is back, so is its
            // record. A retired one is made active by `ensure_mailboxes`,
            // which also recreates its consumer.
            if rec.absent_since_ms.is_some() && rec.retired_at_ms.is_none() {
                let back = MailboxRecord {
                    absent_since_ms: None,
                    ..rec
                };
                match replace(records, &handle, &back, revision).await {
                    Ok(()) => report.restored.push(handle),
                    Err(why) => report.failed.push((handle, why.to_string())),
                }
            }
            continue;
        }
        if rec.retired_at_ms.is_some() {
            continue;
        }
        match rec.absent_since_ms {
            None => {
                let stamped = MailboxRecord {
                    absent_since_ms: Some(now_ms),
                    ..rec
                };
                match replace(records, &handle, &stamped, revision).await {
                    Ok(()) => report.stamped.push(handle),
                    Err(why) => report.failed.push((handle, why.to_string())),
                }
            }
            Some(since) if now_ms.saturating_sub(since) > grace_ms => {
                match retire_mailbox(js, records, &handle, &rec, revision, now_ms).await {
                    Ok(()) => report.retired.push(handle),
                    Err(why) => report.failed.push((handle, why.to_string())),
                }
            }
            Some(_) => {}
        }
    }
    Ok(report)
}

/// Retires one mailbox read as `rec` at `revision` (what
/// [`retire_mailboxes`] does past the grace): deletes its consumer, then
/// marks the record retired by compare-and-set at that revision. If the
/// record moved meanwhile and now says the seat is back, the delete may
/// have taken the returned seat's consumer: it is created again, and the
/// answer says so ([`RetireError::CameBack`]).
pub async fn retire_mailbox(
    js: &jetstream::Context,
    records: &Records,
    handle: &str,
    rec: &MailboxRecord,
    revision: u64,
    now_ms: i64,
) -> Result<(), RetireError> {
    match js
        .delete_consumer_from_stream(&rec.durable, &rec.stream)
        .await
    {
        Ok(_) => {}
        Err(e) if consumer_gone(e.kind()) => {}
        Err(e) => {
            return Err(RetireError::DeleteConsumer {
                durable: rec.durable.clone(),
                stream: rec.stream.clone(),
                detail: e.to_string(),
            });
        }
    }
    let retired = MailboxRecord {
        retired_at_ms: Some(now_ms),
        ..rec.clone()
    };
    match replace(records, handle, &retired, revision).await {
        Err(RetireError::Moved { .. }) => {}
        done => return done,
    }
    let unrestored = |detail: String| RetireError::CameBackUnrestored { revision, detail };
    let current = records
        .get_record(MAILBOX_CLASS, handle)
        .await
        .map_err(|e| unrestored(e.to_string()))?;
    let moved = RetireError::Moved { revision };
    let Answer::Yes((value, _)) = current else {
        return Err(moved);
    };
    match serde_json::from_value::<MailboxRecord>(value) {
        Ok(back) if back.is_active() => {
            let stream = open_stream(js, &back.stream)
                .await
                .map_err(|e| unrestored(e.to_string()))?;
            open_consumer(&stream, handle, &back)
                .await
                .map_err(|e| unrestored(e.to_string()))?;
            Err(RetireError::CameBack { revision })
        }
        _ => Err(moved),
    }
}

/// One compare-and-set of a mailbox record.
async fn replace(
    records: &Records,
    handle: &str,
    rec: &MailboxRecord,
    revision: u64,
) -> Result<(), RetireError> {
    match records
        .replace_record(MAILBOX_CLASS, handle, &rec.to_value(), revision)
        .await
    {
        Ok(Answer::Yes(_)) => Ok(()),
        Ok(Answer::No(())) => Err(RetireError::Moved { revision }),
        Err(e) => Err(RetireError::Store(e.to_string())),
    }
}

/// Makes the record of `handle` equal to `want`: created when absent, left
/// alone when already equal, otherwise replaced at the revision read.
async fn record_active(
    records: &Records,
    handle: &str,
    want: &MailboxRecord,
) -> Result<(), MailboxError> {
    let failed = |e: CoordError| MailboxError::Record {
        handle: handle.to_owned(),
        detail: e.to_string(),
    };
    let (class, value) = (MAILBOX_CLASS, want.to_value());
    for _ in 0..ENSURE_ATTEMPTS {
        match records.get_record(class, handle).await.map_err(failed)? {
            Answer::No(()) => {
                if records
                    .create_record(class, handle, &value)
                    .await
                    .map_err(failed)?
                    .is_yes()
                {
                    return Ok(());
                }
            }
            Answer::Yes((current, revision)) => {
                let current: Option<MailboxRecord> = serde_json::from_value(current).ok();
                if current.as_ref() == Some(want) {
                    return Ok(());
                }
                if records
                    .replace_record(class, handle, &value, revision)
                    .await
                    .map_err(failed)?
                    .is_yes()
                {
                    return Ok(());
                }
            }
        }
    }
    Err(MailboxError::Contended {
        handle: handle.to_owned(),
        attempts: ENSURE_ATTEMPTS,
    })
}

async fn open_stream(
    js: &jetstream::Context,
    name: &str,
) -> Result<jetstream::stream::Stream, MailboxError> {
    js.get_stream(name).await.map_err(|e| MailboxError::Stream {
        stream: name.to_owned(),
        detail: e.to_string(),
    })
}

async fn open_consumer(
    stream: &jetstream::stream::Stream,
    handle: &str,
    rec: &MailboxRecord,
) -> Result<(), MailboxError> {
    crate::consumers::adopt(
        stream,
        consumer::pull::Config {
            durable_name: Some(rec.durable.clone()),
            filter_subject: rec.subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: crate::consumers::MAILBOX_ACK_WAIT,
            description: Some(format!("mailbox of seat {handle}")),
            ..Default::default()
        },
    )
    .await
    .map(|_| ())
    .map_err(|e| MailboxError::Consumer {
        durable: e.durable,
        detail: e.detail,
    })
}

fn consumer_gone(kind: ConsumerErrorKind) -> bool {
    matches!(kind, ConsumerErrorKind::JetStream(e)
        if e.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND
            || e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}
