//! How a plugin call fails: the sandbox's typed faults, and the errors a
//! caller sees (a fault, or the plugin not run at all). Every layer of the
//! call path names these, so they sit below all of them.
//!
//! Every failure says who is to blame ([`Blame`]): the plugin's circuit
//! breaker counts only the guest's own faults, so a plugin whose deadline
//! passes while it waits on the host or a vendor (a slow bucket, a vendor
//! that never answers over `wasi:http`) is not quarantined for it, and a
//! spinning guest still is.

use std::time::Duration;

/// Who a failure is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Blame {
    /// Whoever handed the input: a webhook's sender (a bad signature, a
    /// body that does not parse). Their retry fails the same way.
    Sender,
    /// The plugin's own code: a trap, a spin past its deadline, memory or
    /// stack it ran out of. Counted by its breaker.
    Guest,
    /// The host or what it waits on for the guest (a vendor over
    /// `wasi:http`, the bus, a bucket): the same call may work later, and
    /// the plugin is not charged.
    Host,
}

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
    Fault {
        plugin: String,
        fault: Fault,
        /// [`Blame::Guest`], or [`Blame::Host`] for a deadline that passed
        /// while the guest waited in a host call.
        blame: Blame,
    },
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

    /// Who the failure is charged to: a fault says; an instance that could
    /// not be made, or a bound the host holds the call to, is the host's; a
    /// quarantine is the guest's (its own faults opened the breaker).
    pub fn blame(&self) -> Blame {
        match self {
            CallError::Fault { blame, .. } => *blame,
            CallError::Quarantined { .. } => Blame::Guest,
            CallError::Instantiate { .. } | CallError::Busy { .. } => Blame::Host,
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
