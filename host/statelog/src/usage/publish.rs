//! Every node publishes its own usage objects, whether it holds the
//! estate or not: only the objects whose value moved since its last
//! publish, each awaited to the stream's ack.

use std::collections::HashMap;

use async_nats::jetstream;

use super::UsageObject;
use crate::PublishError;

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
