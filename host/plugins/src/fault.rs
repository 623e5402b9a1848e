//! How a plugin call fails: the sandbox's typed faults, and the errors a
//! caller sees (a fault, or the plugin not run at all). Every layer of the
//! call path names these, so they sit below all of them.

use std::time::Duration;

/// How a call failed inside the sandbox. The host survives every one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("ran past its deadline of {} ms; make the call cheaper or raise limits.deadline_ms", deadline.as_millis())]
    Timeout { deadline: Duration },
    #[error(
        "tried to grow memory to {requested} bytes past its cap of {limit} bytes; raise limits.memory_mib or allocate less"
    )]
    OutOfMemory { limit: u64, requested: u64 },
    #[error("exhausted its stack (unbounded recursion?)")]
    StackOverflow,
    #[error(
        "handed the host more than its transfer bound of {limit} bytes in one call; return or pass less"
    )]
    Oversized { limit: u64 },
    #[error("trapped: {reason}")]
    Trap { reason: String },
}

impl Fault {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Timeout { .. } => "timeout",
            Fault::OutOfMemory { .. } => "out-of-memory",
            Fault::StackOverflow => "stack-overflow",
            Fault::Oversized { .. } => "oversized",
            Fault::Trap { .. } => "trap",
        }
    }
}

/// Why a call did not return a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("plugin `{plugin}` faulted: {fault}")]
    Fault { plugin: String, fault: Fault },
    #[error("plugin `{plugin}` could not be instantiated: {reason}")]
    Instantiate { plugin: String, reason: String },
    #[error("plugin `{plugin}` is quarantined after repeated faults; its next probe is in {} s", retry_after.as_secs().max(1))]
    Quarantined {
        plugin: String,
        retry_after: Duration,
    },
    #[error(
        "plugin `{plugin}` is at its concurrency bound ({concurrency} calls at once); retry shortly"
    )]
    Busy { plugin: String, concurrency: u32 },
}

impl CallError {
    /// The fault, if the call faulted.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            CallError::Fault { fault, .. } => Some(fault),
            _ => None,
        }
    }

    /// Whether the plugin was not run at all (quarantined or busy), and
    /// when to come back.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Quarantined { retry_after, .. } => Some(*retry_after),
            CallError::Busy { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}
