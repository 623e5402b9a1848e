//! The event log of a node without `data`: none of its own. Its events go
//! in batches onto `CREWLET_CUSTODY` ([`crewlet_bus::custody_subject`]),
//! and one data node keeps each batch (`crewlet-history`'s keeper).
//!
//! Rules, and why:
//! - A caller is answered once the batch holding its event is acknowledged
//!   by the stream — the stream is this node's log now, so that is where a
//!   row counts as written. A batch that could not be stored answers every
//!   caller in it with the error, as a refused row does on a data node.
//! - Group batching, as the log's group commit: every event already waiting
//!   goes into one batch (at most [`MAX_BATCH`] rows and [`MAX_BATCH_BYTES`]),
//!   so a quiet node sends one-row batches at once and a busy one fewer,
//!   larger ones, without a timer that delays anybody.
//! - A batch's id is minted once, as its message id, so a retried publish
//!   is stored once (the stream's duplicate window).

use async_nats::{HeaderMap, jetstream};
use crewlet_bus::{MSG_ID_HEADER, custody_subject};
use crewlet_store::{CustodyBatch, EventRecord};
use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use crate::{ACK_TIMEOUT, PublishError, publish_acked};

/// Rows one batch takes at most.
pub const MAX_BATCH: usize = 256;
/// Bytes one batch's rows take at most (half the broker's default payload
/// limit, so a batch is never refused for its size by the server); a
/// larger single row still travels alone.
pub const MAX_BATCH_BYTES: usize = 512 * 1024;
/// Publishes of one batch before its callers are told it failed.
const ATTEMPTS: usize = 3;

pub(crate) type Job = (
    EventRecord,
    oneshot::Sender<Result<EventRecord, PublishError>>,
);

/// Starts the task that batches `node_id`'s events onto the custody stream;
/// it ends when the last sender (every publisher clone) is dropped.
pub(crate) fn start_batcher(node_id: &str, js: jetstream::Context) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(node_id.to_owned(), js, rx));
    tx
}

async fn run(node_id: String, js: jetstream::Context, mut rx: mpsc::UnboundedReceiver<Job>) {
    let subject = custody_subject(&node_id);
    let mut carried: Option<(Job, usize)> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => sized(job),
                None => return,
            },
        };
        let (mut jobs, mut bytes) = (vec![first.0], first.1);
        while jobs.len() < MAX_BATCH {
            let Ok(job) = rx.try_recv() else { break };
            let (job, size) = sized(job);
            if bytes + size > MAX_BATCH_BYTES {
                carried = Some((job, size));
                break;
            }
            jobs.push(job);
            bytes += size;
        }
        let (events, replies): (Vec<EventRecord>, Vec<_>) = jobs.into_iter().unzip();
        let batch = CustodyBatch {
            batch: uuid::Uuid::now_v7().to_string(),
            origin: node_id.clone(),
            events,
        };
        let stored = publish(&js, &subject, &batch).await;
        if let Err(detail) = &stored {
            warn!(subsystem = "observe", batch = %batch.batch, events = batch.events.len(), %detail,
                "a custody batch of this node's events was not stored; its publishers are told");
        }
        for (event, reply) in batch.events.into_iter().zip(replies) {
            let answer = match &stored {
                Ok(()) => Ok(event),
                Err(detail) => Err(PublishError::Custody {
                    event_id: event.event_id,
                    detail: detail.clone(),
                }),
            };
            // The publisher may have stopped waiting.
            let _ = reply.send(answer);
        }
    }
}

fn sized(job: Job) -> (Job, usize) {
    let size = serde_json::to_vec(&job.0).map_or(0, |b| b.len());
    (job, size)
}

async fn publish(
    js: &jetstream::Context,
    subject: &str,
    batch: &CustodyBatch,
) -> Result<(), String> {
    let body = serde_json::to_vec(batch).expect("a batch serialises");
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let mut headers = HeaderMap::new();
        headers.insert(MSG_ID_HEADER, batch.batch.as_str());
        match publish_acked(js, subject.to_owned(), headers, body.clone(), ACK_TIMEOUT).await {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}
