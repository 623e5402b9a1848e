//! `coordination.type = "local"` is for one node: its leases live in this
//! process and fence nothing on any other. Two such nodes on one broker
//! would each hold every seat and both answer every mention.
//!
//! Rule: a node with local coordination answers on
//! [`crewlet_bus::LOCAL_COORDINATION_SUBJECT`] (core NATS) for as long as it
//! runs, and at start asks there whether another does; an answer refuses
//! the start (exit 2), naming the other node and the key to change. Two
//! nodes starting at once each hear the other, so both refuse. A node that
//! joins later is refused by the same question; the node already running
//! logs it at ERROR.

use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tracing::{Instrument, error, info_span};

use crate::engine::Started;

/// How long the question waits for an answer: a broker on loopback or a
/// LAN answers a core request in milliseconds.
const ASK_WITHIN: Duration = Duration::from_millis(750);

/// Another node with local coordination answered on this broker.
#[derive(Debug, thiserror::Error)]
#[error(
    "node {other} already runs with local coordination on this broker: local leases fence nothing between nodes, so two would both hold every seat; give every node of a fleet coordination.type = \"nats\", or run one node"
)]
pub struct Shared {
    pub other: String,
}

/// Starts answering for `node_id`, then asks whether another node answers.
pub async fn claim(
    client: async_nats::Client,
    node_id: &str,
    started: &mut Started,
) -> Result<(), Shared> {
    let subject = crewlet_bus::LOCAL_COORDINATION_SUBJECT;
    let mut asked = match client.subscribe(subject).await {
        Ok(s) => s,
        Err(e) => {
            error!(subsystem = "coordination", error = %e, "cannot answer for local coordination; a second local node on this broker would not be refused");
            return Ok(());
        }
    };
    let (stop_tx, mut stop) = watch::channel(false);
    let me = node_id.to_owned();
    let answerer = client.clone();
    let task = tokio::spawn(
        async move {
            loop {
                let msg = tokio::select! {
                    m = asked.next() => match m { Some(m) => m, None => return },
                    _ = stop.changed() => return,
                };
                let other = String::from_utf8_lossy(&msg.payload).into_owned();
                if other == me {
                    continue;
                }
                error!(subsystem = "coordination", %other, "another node with local coordination asked on this broker; it is refused (local leases fence nothing between nodes)");
                if let Some(reply) = msg.reply {
                    let _ = answerer.publish(reply, me.clone().into()).await;
                }
            }
        }
        .instrument(info_span!("local_guard", subsystem = "coordination")),
    );
    started.push("local coordination guard", move || {
        Box::pin(async move {
            let _ = stop_tx.send(true);
            let _ = task.await;
        })
    });
    let question = client.request(subject, node_id.to_owned().into());
    match tokio::time::timeout(ASK_WITHIN, question).await {
        Ok(Ok(answer)) => Err(Shared {
            other: String::from_utf8_lossy(&answer.payload).into_owned(),
        }),
        // No responders, a timeout, or no answer in time: alone.
        _ => Ok(()),
    }
}
