//! The mailboxes' sweep: work no doorbell announced.
//!
//! Rule: once every [`crate::SeatsConfig::idle_fetch`] the node asks
//! `CREWLET_AGENT` which inbox subjects hold messages (one `STREAM.INFO`
//! narrowed to the inbox subjects) and tells those mailboxes to fetch. The
//! stream keeps a message by interest, until the one mailbox whose subject
//! it is acknowledges it, so a subject holding messages is exactly a
//! mailbox holding work — not yet delivered, handed back with a delay, or
//! delivered and not acknowledged (a redelivery after a lapsed ack wait
//! comes from those). A read that fails tells every mailbox to fetch: a
//! sweep never skips work because a read failed.
//!
//! Why one read and not a fetch per mailbox: what a ring does not announce
//! is rare (a redelivery, a wake handed back with a delay by a previous
//! holder, a ring lost in a reconnect), and a pull request per seat per
//! sweep cost about 0.13 ms of node and nats-server CPU each — at 10,000
//! idle seats every 30 s, 4 % of a core. Listing the stream's consumers
//! instead cost nearly as much (the server computes every consumer's
//! pending counts); the subject index answers from what is stored, so an
//! idle company's sweep reads an empty map.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use crewlet_bus::{AGENT_STREAM, inbox_subject};
use futures::TryStreamExt;
use tokio::sync::watch;
use tracing::debug;

/// What the last sweep found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum Swept {
    /// No sweep ran yet.
    #[default]
    Nothing,
    /// The listing failed: every mailbox fetches.
    All,
    /// The inbox subjects that hold messages.
    These(BTreeSet<String>),
}

impl Swept {
    /// Whether the mailbox reading `subject` should fetch.
    pub(crate) fn wants(&self, subject: &str) -> bool {
        match self {
            Swept::Nothing => false,
            Swept::All => true,
            Swept::These(due) => due.contains(subject),
        }
    }
}

/// Sweeps every `every` until `stop` turns true, publishing each finding.
pub(crate) async fn sweep_loop(
    js: jetstream::Context,
    every: Duration,
    found: watch::Sender<Arc<Swept>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
                continue;
            }
        }
        let swept = match holding_work(&js).await {
            Ok(due) => Swept::These(due),
            Err(e) => {
                debug!(subsystem = "seats", error = %e,
                    "cannot list the mailboxes; every mailbox fetches this sweep");
                Swept::All
            }
        };
        found.send_replace(Arc::new(swept));
    }
}

/// The inbox subjects that hold messages.
async fn holding_work(js: &jetstream::Context) -> Result<BTreeSet<String>, String> {
    let stream = js
        .get_stream_no_info(AGENT_STREAM)
        .await
        .map_err(|e| e.to_string())?;
    let mut subjects = stream
        .info_with_subjects(inbox_subject("*"))
        .await
        .map_err(|e| e.to_string())?;
    let mut due = BTreeSet::new();
    while let Some((subject, count)) = subjects.try_next().await.map_err(|e| e.to_string())? {
        if count > 0 {
            due.insert(subject);
        }
    }
    Ok(due)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_listing_sweeps_everyone_and_none_yet_sweeps_no_one() {
        let (a, b) = (inbox_subject("a"), inbox_subject("b"));
        assert!(!Swept::Nothing.wants(&a));
        assert!(Swept::All.wants(&a));
        let these = Swept::These(BTreeSet::from([a.clone()]));
        assert!(these.wants(&a));
        assert!(!these.wants(&b));
    }
}
