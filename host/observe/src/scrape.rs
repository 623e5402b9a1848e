//! What `GET /metrics` reads at each scrape beside the node's [`crate::Meter`]
//! (every event it recorded, every webhook answer): each plugin's calls,
//! faults, refusals, breaker and call times; this node's lease renewals by
//! answer; the broker connection; the seats held and turns in flight.
//!
//! The values are plain numbers the node reads from its parts (the
//! `MetricsSource` adapter in the node's surface), so this crate stays
//! free of the plugin runtime and the coordination store: it only says
//! them in OpenMetrics.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// One plugin's health, as read at the scrape.
#[derive(Debug, Clone, Default)]
pub struct PluginRow {
    pub name: String,
    /// The plugin's world (`webhook`, `provider`, ...).
    pub kind: &'static str,
    /// Calls that ran (answered or faulted).
    pub calls: u64,
    /// Calls that faulted.
    pub faults: u64,
    /// Calls refused without running.
    pub refused_calls: u64,
    /// Open or half-open breaker.
    pub degraded: bool,
    /// How long the calls that ran took.
    pub latency: Latency,
}

/// A plugin's call times: `(upper bound, calls over the previous bound and
/// at or under this one)`, ascending, then the calls past the last bound.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub buckets: Vec<(Duration, u64)>,
    pub overflow: u64,
    pub sum: Duration,
}

impl Latency {
    fn count(&self) -> u64 {
        self.overflow + self.buckets.iter().map(|(_, n)| n).sum::<u64>()
    }
}

/// This node's lease renewals by the store's answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Renewals {
    pub yes: u64,
    pub no: u64,
    pub unknown: u64,
}

/// What a scrape reads outside the meter; render it beside the meter with
/// [`crate::Meter::render`].
#[derive(Debug, Default)]
pub struct Scrape {
    pub plugins: Vec<PluginRow>,
    pub renewals: Renewals,
    pub broker_connected: bool,
    pub seats_held: u32,
    pub turns_in_flight: u32,
}

type Labels<'a> = [(&'static str, &'a str); 2];

fn plugin_counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[PluginRow],
    value: impl Fn(&PluginRow) -> u64,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for r in rows {
        let labels: Labels = [("plugin", &r.name), ("kind", r.kind)];
        ConstCounter::new(value(r)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// `(sum, count, buckets)` as the encoder takes them: per-bucket counts,
/// the last one past every bound.
fn histogram(latency: &Latency) -> (f64, u64, Vec<(f64, u64)>) {
    let buckets = latency
        .buckets
        .iter()
        .map(|(bound, n)| (bound.as_secs_f64(), *n))
        .chain(std::iter::once((f64::INFINITY, latency.overflow)))
        .collect();
    (latency.sum.as_secs_f64(), latency.count(), buckets)
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = &self.plugins;
        plugin_counter(
            &mut encoder,
            "plugin_calls",
            "Plugin calls that ran (answered or faulted)",
            rows,
            |h| h.calls,
        )?;
        plugin_counter(
            &mut encoder,
            "plugin_faults",
            "Plugin calls that faulted (trap, timeout, memory, ...)",
            rows,
            |h| h.faults,
        )?;
        plugin_counter(
            &mut encoder,
            "plugin_refused_calls",
            "Plugin calls refused without running (quarantined, or at the concurrency bound)",
            rows,
            |h| h.refused_calls,
        )?;
        {
            let mut family = encoder.encode_descriptor(
                "plugin_breaker_open",
                "1 while a plugin's breaker is open or half-open",
                None,
                MetricType::Gauge,
            )?;
            for r in rows {
                let labels: Labels = [("plugin", &r.name), ("kind", r.kind)];
                ConstGauge::new(i64::from(r.degraded)).encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "plugin_call_duration_seconds",
                "How long plugin calls that ran took",
                None,
                MetricType::Histogram,
            )?;
            for r in rows {
                let labels: Labels = [("plugin", &r.name), ("kind", r.kind)];
                let (sum, count, buckets) = histogram(&r.latency);
                family
                    .encode_family(&labels)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                        sum, count, &buckets, None,
                    )?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "lease_renewals",
                "Lease renewals (seats, presence, duties) by the store's answer",
                None,
                MetricType::Counter,
            )?;
            let r = self.renewals;
            for (answer, n) in [("yes", r.yes), ("no", r.no), ("unknown", r.unknown)] {
                ConstCounter::new(n).encode(family.encode_family(&[("answer", answer)])?)?;
            }
        }
        for (name, help, value) in [
            (
                "broker_connected",
                "1 while the node's NATS connection is up",
                i64::from(self.broker_connected),
            ),
            (
                "seats_held",
                "Seats this node holds",
                i64::from(self.seats_held),
            ),
            (
                "turns_in_flight",
                "Turns running on this node",
                i64::from(self.turns_in_flight),
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}
