//! A plugin's health: a circuit breaker over its faults, and fault logging
//! that cannot flood the log.
//!
//! Rules, and why:
//! - **Every fault of the guest's counts** (verify, parse, a model call, a
//!   module step): a plugin whose `verify` passes and whose `parse` always
//!   traps is as broken as one that traps everywhere, and a success in
//!   between does not wipe the count. [`BreakerPolicy::faults_to_open`]
//!   faults within [`BreakerPolicy::window`] open the breaker. A failure
//!   blamed on the host ([`Blame::Host`]: a deadline that passed while the
//!   guest waited on a vendor or a bucket, a lost call) is counted apart
//!   (`host_faults`) and never opens it: quarantining the plugin would not
//!   make the vendor answer.
//! - **Open means not run**: while open, a call is refused at once with
//!   how long to wait ([`Admission::Refused`]); the webhook edge answers its
//!   routes 503 + Retry-After without touching the plugin, so a hostile or
//!   broken plugin costs the node nothing while it is quarantined.
//! - **Half-open probes with backoff**: when the open period ends one call
//!   is let through; a success closes the breaker (and resets the backoff),
//!   a fault opens it again for twice as long, up to
//!   [`BreakerPolicy::max_backoff`]. A probe that never settles (its
//!   caller went away) frees the probe slot after its deadline.
//! - **Fault lines are rationed per plugin** ([`crate::ration`]): at most
//!   one WARN line per [`FAULT_LOG_INTERVAL`]; the next line says how many
//!   were suppressed. Breaker transitions are always logged.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fault::{Blame, Fault};
use crate::latency::{Latency, Timings};
use crate::ration::{Ration, Verdict};

/// The shortest gap between two fault lines of one plugin.
pub const FAULT_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// When a breaker opens and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerPolicy {
    /// Faults within `window` that open the breaker.
    pub faults_to_open: u32,
    pub window: Duration,
    /// The first open period; doubled after each failed probe.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        BreakerPolicy {
            faults_to_open: 5,
            window: Duration::from_secs(30),
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

/// Whether a call may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Run,
    /// Quarantined: come back after this long.
    Refused {
        retry_after: Duration,
    },
}

#[derive(Debug)]
enum Phase {
    Closed,
    Open {
        until: Instant,
        backoff: Duration,
    },
    HalfOpen {
        backoff: Duration,
        /// The probe in flight, and when its slot frees if it never settles.
        probe_until: Option<Instant>,
    },
}

#[derive(Debug)]
struct Inner {
    phase: Phase,
    /// When the faults inside the window happened, oldest first.
    recent: VecDeque<Instant>,
    consecutive: u32,
    last_fault: Option<String>,
    last_fault_kind: Option<&'static str>,
}

/// A plugin's health as reported to operators (`GET /plugins`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// Open or half-open: the plugin is quarantined or on probation.
    pub degraded: bool,
    pub breaker: BreakerState,
    /// While open, how long until the next probe.
    pub retry_after: Option<Duration>,
    pub faults_in_window: u32,
    pub consecutive_faults: u32,
    pub total_faults: u64,
    /// Failures blamed on the host, not counted by the breaker.
    pub host_faults: u64,
    pub total_calls: u64,
    /// Calls refused without running, while quarantined or at the
    /// plugin's concurrency bound.
    pub refused_calls: u64,
    pub last_fault: Option<String>,
    pub last_fault_kind: Option<&'static str>,
    /// How long the calls that ran took.
    pub latency: Latency,
}

/// Fault bookkeeping and the breaker of one plugin.
#[derive(Debug)]
pub struct Health {
    plugin: String,
    policy: BreakerPolicy,
    inner: Mutex<Inner>,
    faults: AtomicU64,
    host_faults: AtomicU64,
    calls: AtomicU64,
    refused: AtomicU64,
    timings: Timings,
    fault_lines: Ration,
}

impl Health {
    pub fn new(plugin: &str, policy: BreakerPolicy) -> Health {
        Health {
            plugin: plugin.to_string(),
            policy,
            inner: Mutex::new(Inner {
                phase: Phase::Closed,
                recent: VecDeque::new(),
                consecutive: 0,
                last_fault: None,
                last_fault_kind: None,
            }),
            faults: AtomicU64::new(0),
            host_faults: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            timings: Timings::default(),
            fault_lines: Ration::new(1, FAULT_LOG_INTERVAL),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may run now. A call admitted in the half-open phase
    /// is the probe; `deadline` bounds how long its slot stays taken.
    pub fn admit(&self, deadline: Duration) -> Admission {
        let now = Instant::now();
        let mut inner = self.lock();
        let refused = match inner.phase {
            Phase::Closed => return Admission::Run,
            Phase::Open { until, backoff } if now >= until => {
                inner.phase = Phase::HalfOpen {
                    backoff,
                    probe_until: Some(now + deadline * 2),
                };
                tracing::info!(plugin = %self.plugin, "plugin breaker half-open: one probe call let through");
                return Admission::Run;
            }
            Phase::Open { until, .. } => until - now,
            Phase::HalfOpen {
                backoff,
                probe_until,
            } => match probe_until {
                Some(t) if now < t => t - now,
                _ => {
                    inner.phase = Phase::HalfOpen {
                        backoff,
                        probe_until: Some(now + deadline * 2),
                    };
                    return Admission::Run;
                }
            },
        };
        drop(inner);
        self.refused.fetch_add(1, Ordering::Relaxed);
        Admission::Refused {
            retry_after: refused.max(Duration::from_secs(1)),
        }
    }

    /// Counts a call refused before it ran for a reason of its own (the
    /// concurrency bound).
    pub(crate) fn record_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_ok(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.lock();
        inner.consecutive = 0;
        if let Phase::HalfOpen { .. } = inner.phase {
            inner.phase = Phase::Closed;
            inner.recent.clear();
            tracing::info!(plugin = %self.plugin, "plugin breaker closed: the probe call succeeded");
        }
    }

    /// A call that failed, charged to `blame`: only [`Blame::Guest`]
    /// counts towards the breaker.
    pub(crate) fn record_fault(&self, fault: &Fault, blame: Blame) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        if blame != Blame::Guest {
            self.host_faults.fetch_add(1, Ordering::Relaxed);
            let mut inner = self.lock();
            // A probe the host failed proves nothing either way: the next
            // call probes again.
            if let Phase::HalfOpen { backoff, .. } = inner.phase {
                inner.phase = Phase::HalfOpen {
                    backoff,
                    probe_until: None,
                };
            }
            drop(inner);
            self.log_fault(now, fault, blame);
            return;
        }
        self.faults.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.lock();
        inner.consecutive += 1;
        inner.last_fault = Some(fault.to_string());
        inner.last_fault_kind = Some(fault.kind());
        let window = self.policy.window;
        while inner.recent.front().is_some_and(|t| now - *t > window) {
            inner.recent.pop_front();
        }
        inner.recent.push_back(now);
        let cap = self.policy.faults_to_open.max(1) as usize;
        while inner.recent.len() > cap {
            inner.recent.pop_front();
        }
        self.log_fault(now, fault, blame);
        let reopen = match inner.phase {
            Phase::HalfOpen { backoff, .. } => Some((backoff * 2).min(self.policy.max_backoff)),
            Phase::Closed if inner.recent.len() >= cap => Some(self.policy.first_backoff),
            _ => None,
        };
        if let Some(backoff) = reopen {
            inner.phase = Phase::Open {
                until: now + backoff,
                backoff,
            };
            tracing::error!(
                plugin = %self.plugin,
                faults_in_window = inner.recent.len(),
                open_for_ms = backoff.as_millis() as u64,
                fault = fault.kind(),
                "plugin breaker open: its calls are refused without running it until the next probe"
            );
        }
    }

    fn log_fault(&self, now: Instant, fault: &Fault, blame: Blame) {
        let Verdict::Write {
            dropped: suppressed,
        } = self.fault_lines.take(now)
        else {
            return;
        };
        match blame {
            Blame::Guest => tracing::warn!(
                plugin = %self.plugin,
                fault = fault.kind(),
                suppressed,
                "plugin call faulted: {fault}"
            ),
            _ => tracing::warn!(
                plugin = %self.plugin,
                fault = fault.kind(),
                ?blame,
                suppressed,
                "plugin call failed waiting on the host, not charged to the plugin: {fault}"
            ),
        }
    }

    /// The current report.
    pub fn report(&self) -> HealthReport {
        let now = Instant::now();
        let inner = self.lock();
        let (breaker, retry_after) = match inner.phase {
            Phase::Closed => (BreakerState::Closed, None),
            Phase::Open { until, .. } => (
                BreakerState::Open,
                Some(until.saturating_duration_since(now)),
            ),
            Phase::HalfOpen { .. } => (BreakerState::HalfOpen, None),
        };
        let window = self.policy.window;
        HealthReport {
            degraded: breaker != BreakerState::Closed,
            breaker,
            retry_after,
            faults_in_window: inner.recent.iter().filter(|t| now - **t <= window).count() as u32,
            consecutive_faults: inner.consecutive,
            total_faults: self.faults.load(Ordering::Relaxed),
            host_faults: self.host_faults.load(Ordering::Relaxed),
            total_calls: self.calls.load(Ordering::Relaxed),
            refused_calls: self.refused.load(Ordering::Relaxed),
            last_fault: inner.last_fault.clone(),
            last_fault_kind: inner.last_fault_kind,
            latency: self.timings.read(),
        }
    }

    /// A call that ran (to an answer or a fault) took `took`.
    pub(crate) fn record_took(&self, took: Duration) {
        self.timings.record(took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> BreakerPolicy {
        BreakerPolicy {
            faults_to_open: 3,
            window: Duration::from_secs(10),
            first_backoff: Duration::from_millis(40),
            max_backoff: Duration::from_millis(100),
        }
    }

    fn trap() -> Fault {
        Fault::Trap {
            reason: "unreachable".into(),
        }
    }

    #[test]
    fn faults_in_the_window_open_it_and_successes_between_do_not_reset_it() {
        let h = Health::new("p", quick());
        h.record_fault(&trap(), Blame::Guest);
        h.record_ok();
        h.record_fault(&trap(), Blame::Guest);
        h.record_ok();
        assert_eq!(h.admit(Duration::from_millis(10)), Admission::Run);
        h.record_fault(&trap(), Blame::Guest);
        let r = h.report();
        assert_eq!(r.breaker, BreakerState::Open, "{r:?}");
        assert!(r.degraded);
        assert!(matches!(
            h.admit(Duration::from_millis(10)),
            Admission::Refused { .. }
        ));
        assert_eq!(h.report().refused_calls, 1);
    }

    #[test]
    fn a_probe_closes_it_or_opens_it_for_longer() {
        let h = Health::new("p", quick());
        for _ in 0..3 {
            h.record_fault(&trap(), Blame::Guest);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(h.admit(Duration::from_millis(10)), Admission::Run, "probe");
        // Only one probe at a time.
        assert!(matches!(
            h.admit(Duration::from_millis(10)),
            Admission::Refused { .. }
        ));
        h.record_fault(&trap(), Blame::Guest);
        let r = h.report();
        assert_eq!(r.breaker, BreakerState::Open);
        assert!(r.retry_after.unwrap() > Duration::from_millis(50), "{r:?}");
        std::thread::sleep(Duration::from_millis(90));
        assert_eq!(h.admit(Duration::from_millis(10)), Admission::Run);
        h.record_ok();
        assert_eq!(h.report().breaker, BreakerState::Closed);
        assert_eq!(h.report().faults_in_window, 0);
    }

    #[test]
    fn faults_blamed_on_the_host_never_open_it() {
        let h = Health::new("p", quick());
        let timeout = Fault::Timeout {
            deadline: Duration::from_millis(5),
        };
        for _ in 0..10 {
            h.record_fault(&timeout, Blame::Host);
        }
        let r = h.report();
        assert_eq!(r.breaker, BreakerState::Closed, "{r:?}");
        assert_eq!((r.total_faults, r.host_faults, r.total_calls), (0, 10, 10));
        assert_eq!(r.faults_in_window, 0);
        // A probe the host failed frees its slot at once.
        for _ in 0..3 {
            h.record_fault(&trap(), Blame::Guest);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(h.admit(Duration::from_secs(10)), Admission::Run, "probe");
        h.record_fault(&timeout, Blame::Host);
        assert_eq!(h.report().breaker, BreakerState::HalfOpen);
        assert_eq!(
            h.admit(Duration::from_secs(10)),
            Admission::Run,
            "next probe"
        );
    }

    #[test]
    fn a_probe_that_never_settles_frees_its_slot_after_its_deadline() {
        let h = Health::new("p", quick());
        for _ in 0..3 {
            h.record_fault(&trap(), Blame::Guest);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(h.admit(Duration::from_millis(5)), Admission::Run);
        std::thread::sleep(Duration::from_millis(15));
        assert_eq!(h.admit(Duration::from_millis(5)), Admission::Run);
    }
}
