//! Why a store could not be opened: shared by every backend and by the
//! named buckets, so it sits below all of them.

/// Why opening a coordination backend (or one of its buckets) failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "bucket {bucket} has {has} replica(s) but this node is configured for {want}; raise it (`nats stream update KV_{bucket} --replicas={want}`) or lower stream.replicas — refusing to start on fewer copies than configured"
    )]
    TooFewReplicas {
        bucket: String,
        has: usize,
        want: usize,
    },
    #[error(
        "cannot open bucket {bucket} ({why}); check that the broker has JetStream enabled and is reachable on this node's connection"
    )]
    Bucket { bucket: String, why: String },
    #[error(transparent)]
    Unreachable(Box<crate::reach::Unreachable>),
}
