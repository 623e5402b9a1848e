//! What a failed attempt was, what it decides, and the line that says so.
//!
//! Rules, and why (Architecture §2, "one model call has three layers"):
//! - The plugin classifies; this module only maps a class to a decision.
//!   `rate-limited` and `auth` are the key's fault: bench it and retry the
//!   same model with another key. Everything else — the vendor overloaded or
//!   failing, a request it will never accept, a plugin fault, no usable key —
//!   is the model's problem: move to the next model in the chain.
//! - What a failure says (in a log, an event, [`crate::Exhausted`]) is the
//!   backend's own line: kind, status, the vendor's request id and its
//!   message, with any credential value replaced by its hint. Never a raw
//!   body.

use std::fmt;
use std::time::Duration;

use crewlet_plugins::CallError;
use crewlet_plugins::provider::{ErrorKind, ProviderError};
use serde::Serialize;

use crate::pool::Credential;

/// The class of one failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Failure {
    RateLimited {
        retry_after_ms: Option<u64>,
    },
    Auth,
    Overloaded,
    Transient,
    BadRequest,
    ContextTooLong,
    RequestDenied,
    /// The plugin trapped, timed out or could not be instantiated.
    PluginFault,
    /// No provider plugin of the entry's name is loaded.
    NoProvider,
    /// Every key of the entry is cooling or unresolvable.
    NoKey,
}

/// What a failure decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Bench the key this long, retry the same model with another key.
    BenchKey(Duration),
    /// Give up on this model; the chain moves on.
    NextModel,
}

/// The least a cooldown lasts unless the node configures another floor.
pub const DEFAULT_COOLDOWN_FLOOR: Duration = Duration::from_secs(60);

/// Cooldown lengths for the key's failures.
///
/// Every bench lasts at least [`floor`](Self::floor), whatever the vendor
/// advised: peers learn of a bench only on their next pull of the fleet's
/// cooldowns (every 15 s), so a bench shorter than that could end before any
/// peer read it and each would pay its own 429 to learn it again. At a
/// minute, reading one a few seconds late costs nothing (Coordination,
/// "Credential cooldowns, in practice"). The floor is the node's
/// `models.cooldown_floor_seconds`, refused below the pull interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CooldownPolicy {
    /// A 429 without advice; never below the floor.
    pub rate_limited_default: Duration,
    /// A refused key.
    pub auth: Duration,
    /// The least any bench lasts (a 429 advising 0 s still benches for it).
    pub floor: Duration,
}

impl CooldownPolicy {
    /// The default lengths under `floor`: an un-advised 429 is benched for
    /// the floor when the floor is the longer.
    pub fn with_floor(floor: Duration) -> CooldownPolicy {
        CooldownPolicy {
            rate_limited_default: Duration::from_secs(60).max(floor),
            auth: Duration::from_secs(600),
            floor,
        }
    }
}

impl Default for CooldownPolicy {
    fn default() -> CooldownPolicy {
        CooldownPolicy::with_floor(DEFAULT_COOLDOWN_FLOOR)
    }
}

impl Failure {
    /// The class the plugin reported, in the provider world's words.
    pub(crate) fn of(kind: &ErrorKind) -> Failure {
        match kind {
            ErrorKind::RateLimited(ms) => Failure::RateLimited {
                retry_after_ms: *ms,
            },
            ErrorKind::Auth => Failure::Auth,
            ErrorKind::Overloaded => Failure::Overloaded,
            ErrorKind::BadRequest => Failure::BadRequest,
            ErrorKind::ContextTooLong => Failure::ContextTooLong,
            ErrorKind::Transient => Failure::Transient,
            ErrorKind::RequestDenied => Failure::RequestDenied,
        }
    }

    pub fn decide(&self, policy: &CooldownPolicy) -> Decision {
        match self {
            Failure::RateLimited { retry_after_ms } => Decision::BenchKey(
                retry_after_ms
                    .map(Duration::from_millis)
                    .unwrap_or(policy.rate_limited_default)
                    .max(policy.floor),
            ),
            Failure::Auth => Decision::BenchKey(policy.auth.max(policy.floor)),
            _ => Decision::NextModel,
        }
    }

    /// The WIT spelling (`rate-limited`, `plugin-fault`).
    pub fn name(&self) -> &'static str {
        match self {
            Failure::RateLimited { .. } => "rate-limited",
            Failure::Auth => "auth",
            Failure::Overloaded => "overloaded",
            Failure::Transient => "transient",
            Failure::BadRequest => "bad-request",
            Failure::ContextTooLong => "context-too-long",
            Failure::RequestDenied => "request-denied",
            Failure::PluginFault => "plugin-fault",
            Failure::NoProvider => "no-provider",
            Failure::NoKey => "no-key",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Replaces every credential value in `text` with `[key HINT]`.
pub fn redact(text: &str, keys: &[Credential]) -> String {
    let mut out = text.to_owned();
    for k in keys {
        let v = k.secret.expose();
        if v.len() >= 4 {
            out = out.replace(v, &format!("[key {}]", k.hint.as_str()));
        }
    }
    out
}

/// The backend's line for a classified failure:
/// `rate-limited (HTTP 429, request req_1): the vendor's message`.
pub(crate) fn provider_line(e: &ProviderError, keys: &[Credential]) -> String {
    let mut facts = Vec::new();
    if let Some(s) = e.status {
        facts.push(format!("HTTP {s}"));
    }
    if let Some(r) = &e.request_id {
        facts.push(format!("request {r}"));
    }
    let kind = Failure::of(&e.kind);
    let head = if facts.is_empty() {
        kind.name().to_owned()
    } else {
        format!("{} ({})", kind.name(), facts.join(", "))
    };
    redact(&format!("{head}: {}", e.message), keys)
}

/// The line for a plugin that faulted instead of answering.
pub(crate) fn fault_line(e: &CallError, keys: &[Credential]) -> String {
    redact(&format!("plugin-fault: {e}"), keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_keys_failures_bench_and_every_bench_has_a_floor() {
        let p = CooldownPolicy::default();
        let rl = |ms| Failure::RateLimited { retry_after_ms: ms }.decide(&p);
        assert_eq!(
            rl(Some(90_000)),
            Decision::BenchKey(Duration::from_secs(90))
        );
        assert_eq!(rl(Some(7_000)), Decision::BenchKey(Duration::from_secs(60)));
        assert_eq!(rl(None), Decision::BenchKey(Duration::from_secs(60)));
        assert_eq!(rl(Some(0)), Decision::BenchKey(Duration::from_secs(60)));
        assert_eq!(
            Failure::Auth.decide(&p),
            Decision::BenchKey(Duration::from_secs(600))
        );
        for f in [
            Failure::Overloaded,
            Failure::Transient,
            Failure::BadRequest,
            Failure::ContextTooLong,
            Failure::RequestDenied,
            Failure::PluginFault,
            Failure::NoProvider,
            Failure::NoKey,
        ] {
            assert_eq!(f.decide(&p), Decision::NextModel, "{f}");
        }
    }

    #[test]
    fn a_429_advising_one_second_benches_the_key_for_a_minute() {
        let rl = |p: &CooldownPolicy, ms| Failure::RateLimited { retry_after_ms: ms }.decide(p);
        let p = CooldownPolicy::default();
        assert_eq!(p.floor, Duration::from_secs(60));
        assert_eq!(
            rl(&p, Some(1_000)),
            Decision::BenchKey(Duration::from_secs(60))
        );
        assert!(p.rate_limited_default >= p.floor);
    }

    #[test]
    fn a_configured_floor_is_honoured_by_every_bench() {
        let rl = |p: &CooldownPolicy, ms| Failure::RateLimited { retry_after_ms: ms }.decide(p);
        let high = CooldownPolicy::with_floor(Duration::from_secs(120));
        assert_eq!(
            rl(&high, Some(1_000)),
            Decision::BenchKey(Duration::from_secs(120))
        );
        assert_eq!(
            rl(&high, None),
            Decision::BenchKey(Duration::from_secs(120))
        );
        assert_eq!(
            rl(&high, Some(300_000)),
            Decision::BenchKey(Duration::from_secs(300))
        );
        assert_eq!(
            Failure::Auth.decide(&CooldownPolicy::with_floor(Duration::from_secs(900))),
            Decision::BenchKey(Duration::from_secs(900))
        );
        let low = CooldownPolicy::with_floor(Duration::from_secs(20));
        assert_eq!(
            rl(&low, Some(1_000)),
            Decision::BenchKey(Duration::from_secs(20))
        );
        assert_eq!(
            rl(&low, None),
            Decision::BenchKey(Duration::from_secs(60)),
            "a lower floor does not shorten an un-advised 429"
        );
    }

    #[test]
    fn the_line_is_kind_status_request_and_message_with_keys_replaced_by_hints() {
        let keys = [Credential::new("K", "secret-value-123".into())];
        let e = ProviderError {
            kind: ErrorKind::RateLimited(Some(3000)),
            status: Some(429),
            request_id: Some("req_9".into()),
            message: "slow down, secret-value-123".into(),
        };
        let hint = keys[0].hint.as_str();
        assert_eq!(
            provider_line(&e, &keys),
            format!("rate-limited (HTTP 429, request req_9): slow down, [key {hint}]")
        );
        let bare = ProviderError {
            kind: ErrorKind::Transient,
            status: None,
            request_id: None,
            message: "connection reset".into(),
        };
        assert_eq!(provider_line(&bare, &keys), "transient: connection reset");
    }
}
