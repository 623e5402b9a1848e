//! `GET /metrics`: the node's [`crewlet_observe::Meter`] (every event it
//! recorded, every webhook answer) and, read at each scrape, what lives
//! elsewhere: each plugin's calls, faults, refusals, breaker and call
//! times; this node's lease renewals by answer; the broker connection; the
//! seats held and turns in flight.
//!
//! Served on every node (an ingress node's router, or beside the probes of
//! a node without `ingress`), behind the operator guard with `read` scope:
//! point Prometheus at it with a read token (`authorization:
//! credentials_file`). Until the engine is up it answers 503.

use crewlet_api::{MetricsSource, Scraped, Unavailable};
use crewlet_coord::RenewalCounts;
use crewlet_plugins::{HealthReport, Latency};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::engine::{EngineContext, Late};

/// The route every node serves, whatever its roles (`crewlet-api`'s).
pub(crate) fn routes(late: Late) -> axum::Router {
    crewlet_api::metrics::routes(std::sync::Arc::new(Metrics(late)))
}

/// This node's meter, and what the scrape reads beside it.
struct Metrics(Late);

impl MetricsSource for Metrics {
    fn scrape(&self) -> Result<Scraped, Unavailable> {
        let Some(ctx) = self.0.get() else {
            return Err(Unavailable {
                error: "starting",
                detail: "the node's engine is still starting; metrics are served once it is up"
                    .into(),
            });
        };
        let body = ctx
            .publisher
            .meter()
            .render(vec![Box::new(Scrape::of(ctx))]);
        Ok(Scraped {
            content_type: crewlet_observe::OPENMETRICS_CONTENT_TYPE,
            body,
        })
    }
}

/// One plugin's health, as read at the scrape.
#[derive(Debug)]
struct PluginRow {
    name: String,
    kind: &'static str,
    health: HealthReport,
}

/// What this scrape read outside the meter.
#[derive(Debug)]
struct Scrape {
    plugins: Vec<PluginRow>,
    renewals: RenewalCounts,
    broker_connected: bool,
    seats_held: u32,
    turns_in_flight: u32,
}

impl Scrape {
    fn of(ctx: &EngineContext) -> Scrape {
        let mut plugins = Vec::new();
        if let Some(loaded) = &ctx.plugins {
            let row = |m: &crewlet_plugins::Manifest, health| PluginRow {
                name: m.name.clone(),
                kind: m.kind.world(),
                health,
            };
            plugins.extend(
                loaded
                    .installed
                    .all()
                    .iter()
                    .map(|p| row(p.manifest(), p.health())),
            );
        }
        Scrape {
            plugins,
            renewals: ctx.coord.renewals(),
            broker_connected: ctx.client.connection_state()
                == async_nats::connection::State::Connected,
            seats_held: ctx.state.seats_held(),
            turns_in_flight: ctx.state.turns_in_flight(),
        }
    }
}

type Labels<'a> = [(&'static str, &'a str); 2];

fn plugin_counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[PluginRow],
    value: impl Fn(&HealthReport) -> u64,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for r in rows {
        let labels: Labels = [("plugin", &r.name), ("kind", r.kind)];
        ConstCounter::new(value(&r.health)).encode(family.encode_family(&labels)?)?;
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
            |h| h.total_calls,
        )?;
        plugin_counter(
            &mut encoder,
            "plugin_faults",
            "Plugin calls that faulted (trap, timeout, memory, ...)",
            rows,
            |h| h.total_faults,
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
                ConstGauge::new(i64::from(r.health.degraded))
                    .encode(family.encode_family(&labels)?)?;
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
                let (sum, count, buckets) = histogram(&r.health.latency);
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
