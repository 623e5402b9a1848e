//! Every node publishes its own usage objects, whether it holds the
//! estate or not: only the objects whose value moved since its last
//! publish, each awaited to the stream's ack.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use futures::StreamExt;

use super::UsageObject;
use crate::PublishError;
use crate::record::Incoming;

/// How long reading back a node's published values may take.
const READ_BACK: Duration = Duration::from_secs(10);

/// This node's usage writer. One per node; after a restart it starts with
/// nothing published and republishes its days whole, which replaces rather
/// than adds.
pub struct UsagePublisher {
    js: jetstream::Context,
    published: HashMap<String, UsageObject>,
}

impl UsagePublisher {
    pub fn new(js: jetstream::Context) -> UsagePublisher {
        UsagePublisher {
            js,
            published: HashMap::new(),
        }
    }

    /// Publishes every object of `objects` whose value differs from what
    /// this publisher last published on its subject; answers how many.
    pub async fn publish(&mut self, objects: Vec<UsageObject>) -> Result<usize, PublishError> {
        let mut sent = 0;
        for object in objects {
            let subject = object.subject();
            if self.published.get(&subject) == Some(&object) {
                continue;
            }
            crate::append(&self.js, &subject, &object.record()).await?;
            self.published.insert(subject, object);
            sent += 1;
        }
        Ok(sent)
    }
}

/// The values `node` last published, each object's newest (a compacted
/// log keeps one per subject), from `since_day` on. How a node without
/// `data` resumes its open days after a restart: it has no log to count
/// them from, and publishing less would replace what it counted before.
/// A record this build cannot read is left out (the newer build that
/// wrote it republishes it whole).
pub async fn published(
    js: &jetstream::Context,
    node: &str,
    since_day: &str,
) -> Result<Vec<UsageObject>, PublishError> {
    let failed = |reason: String| PublishError::Broker {
        subject: format!("{}.*.{node}.>", crewlet_bus::USAGE_LOG_PREFIX),
        reason: format!("reading back this node's published usage: {reason}"),
    };
    let stream = js
        .get_stream(crewlet_bus::USAGE_LOG_STREAM)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: format!("{}.*.{node}.>", crewlet_bus::USAGE_LOG_PREFIX),
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut left = consumer
        .info()
        .await
        .map_err(|e| failed(e.to_string()))?
        .num_pending;
    let mut out = Vec::new();
    if left == 0 {
        return Ok(out);
    }
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + READ_BACK;
    while left > 0 {
        let m = tokio::time::timeout_at(deadline, messages.next())
            .await
            .map_err(|_| failed(format!("not read within {} s", READ_BACK.as_secs())))?
            .ok_or_else(|| failed("the reader ended".into()))?
            .map_err(|e| failed(e.to_string()))?;
        left = m.info().map_err(|e| failed(e.to_string()))?.pending;
        let Ok(object) =
            Incoming::decode(m.payload.clone()).and_then(|r| UsageObject::from_record(&r))
        else {
            continue;
        };
        if object.day() >= since_day {
            out.push(object);
        }
    }
    Ok(out)
}
