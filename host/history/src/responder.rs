//! This node answering its peers' history reads on
//! [`crewlet_bus::history_subject`] of its own id, from its own log.
//!
//! Rules:
//! - It is up before presence, so a node the fleet can see can be asked.
//! - At most [`CONCURRENT`] reads run at once (each is a SQLite read on a
//!   blocking thread); one more waits for a slot rather than taking a
//!   thread from the writers, and the loop itself never waits on a slot,
//!   so a stop is heard at once. A read the asker gave up on is answered to
//!   nobody, which costs nothing.
//! - Stopped by [`Responder::stop`] (the node's teardown stack calls it):
//!   the subscription ends, reads in flight are abandoned (their askers
//!   time out and name this node).

use std::sync::Arc;

use crewlet_store::Store;
use futures::StreamExt;
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{Instrument, info_span, warn};

use super::local::{Ask, Told, answer_off_thread};

/// History reads answered at once.
const CONCURRENT: usize = 4;
/// Bytes kept free of rows in an answer, for the envelope and headers.
const HEADROOM: usize = 8 * 1024;

/// Why this node cannot answer its peers' history reads.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "cannot subscribe to {subject} to answer the fleet's history reads ({source}); peers will name this node as not answering until it restarts with the broker reachable"
    )]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
}

/// This node answering its peers' history reads, until stopped.
pub struct Responder {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Responder {
    /// Subscribes and answers until [`Responder::stop`]. A subscription
    /// that cannot be made is an error: peers then find no responder and
    /// name this node in their coverage.
    pub async fn start(
        client: async_nats::Client,
        node_id: String,
        store: Arc<Store>,
        since_ms: i64,
    ) -> Result<Responder, StartError> {
        let subject = crewlet_bus::history_subject(&node_id);
        let sub = client
            .subscribe(subject.clone())
            .await
            .map_err(|source| StartError::Subscribe { subject, source })?;
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(
            serve(client, sub, node_id, store, since_ms, stopped)
                .instrument(info_span!("history", subsystem = "history")),
        );
        Ok(Responder { stop, task })
    }

    /// Ends the subscription and abandons reads in flight.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn serve(
    client: async_nats::Client,
    mut sub: async_nats::Subscriber,
    node_id: String,
    store: Arc<Store>,
    since_ms: i64,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(CONCURRENT));
    let mut reads = JoinSet::new();
    loop {
        let msg = tokio::select! {
            m = sub.next() => match m {
                Some(m) => m,
                None => break,
            },
            _ = stop.wait_for(|s| *s) => break,
            // Reap finished reads so the set does not grow.
            Some(_) = reads.join_next(), if !reads.is_empty() => continue,
        };
        let Some(reply) = msg.reply.clone() else {
            continue;
        };
        let slots = slots.clone();
        let room = (client.server_info().max_payload).saturating_sub(HEADROOM);
        let (client, store, node) = (client.clone(), store.clone(), node_id.clone());
        reads.spawn(
            async move {
                let Ok(slot) = slots.acquire_owned().await else {
                    return;
                };
                let told = match serde_json::from_slice::<Ask>(&msg.payload) {
                    Ok(ask) => answer_off_thread(store, node, ask, since_ms, room).await,
                    Err(e) => Told {
                        node,
                        error: Some(format!(
                            "not a history read this node understands ({e}); is the asker a newer build?"
                        )),
                        ..Told::default()
                    },
                };
                drop(slot);
                let body = serde_json::to_vec(&told).unwrap_or_default();
                if let Err(e) = client.publish(reply, body.into()).await {
                    warn!(subsystem = "history", error = %e, "a history answer was not sent");
                }
            }
            .in_current_span(),
        );
    }
    let _ = sub.unsubscribe().await;
    reads.abort_all();
}
