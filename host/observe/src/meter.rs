//! What this node did, as Prometheus metrics (`GET /metrics`).
//!
//! Rules, and why:
//! - **Counted where it is recorded.** Every event this node records passes
//!   through its one [`crate::Publisher`], which hands it to the [`Meter`]:
//!   turns by outcome, model calls and tokens by model, tool calls, wakes,
//!   budget refusals are read off the events the node already writes, so a
//!   metric can never disagree with the event log. What has no event of its
//!   own (every webhook answer, including the rationed refusals) is counted
//!   by its one caller ([`Meter::delivery`]).
//! - **Bounded labels.** A label value comes from the company or the
//!   catalogue (a seat, a model, a tool, a plugin's source), never from a
//!   sender: a source no plugin serves is counted as `unserved`, so a
//!   stranger cannot grow the series.
//! - **Per node.** Each node exports its own counts; Prometheus sums the
//!   fleet. What lives elsewhere (plugins' health, lease renewals, the
//!   broker connection) is read at scrape time by the caller's
//!   [`Collector`]s, handed to [`Meter::render`].
//! - **OpenMetrics text**, the Prometheus project's own client
//!   (`prometheus-client`): one registry built per scrape over the shared
//!   families, no global state.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde_json::Value;

/// The content type of [`Meter::render`]'s text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A webhook source no plugin serves, as a label value.
pub const UNSERVED: &str = "unserved";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    source: String,
    status: u16,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WakeLabels {
    source: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    model: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    result: &'static str,
}

type Timings<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds, 1 ms to ~65 s in doublings: a tool call to a whole turn.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn timings<L: Clone + std::hash::Hash + Eq>() -> Timings<L> {
    Family::new_with_constructor(seconds)
}

/// This node's counters, shared by every clone.
#[derive(Clone, Debug)]
pub struct Meter {
    f: Arc<Families>,
}

#[derive(Debug)]
struct Families {
    deliveries: Family<DeliveryLabels, Counter>,
    events: Family<KindLabels, Counter>,
    wakes: Family<WakeLabels, Counter>,
    turns: Family<OutcomeLabels, Counter>,
    turn_seconds: Timings<OutcomeLabels>,
    model_calls: Family<ModelLabels, Counter>,
    model_seconds: Timings<ModelLabels>,
    tokens: Family<TokenLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_seconds: Timings<ToolLabels>,
    budget_refusals: Counter,
    replies: Counter,
}

impl Default for Meter {
    fn default() -> Self {
        Meter::new()
    }
}

fn text<'a>(payload: &'a Value, key: &str) -> &'a str {
    payload.get(key).and_then(Value::as_str).unwrap_or("")
}

fn number(payload: &Value, key: &str) -> u64 {
    payload.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Milliseconds from an event's payload as seconds; `us` when present.
fn elapsed(payload: &Value) -> f64 {
    match payload.get("us").and_then(Value::as_u64) {
        Some(us) => us as f64 / 1e6,
        None => number(payload, "ms") as f64 / 1e3,
    }
}

impl Meter {
    pub fn new() -> Meter {
        Meter {
            f: Arc::new(Families {
                deliveries: Family::default(),
                events: Family::default(),
                wakes: Family::default(),
                turns: Family::default(),
                turn_seconds: timings(),
                model_calls: Family::default(),
                model_seconds: timings(),
                tokens: Family::default(),
                tool_calls: Family::default(),
                tool_seconds: timings(),
                budget_refusals: Counter::default(),
                replies: Counter::default(),
            }),
        }
    }

    /// One answer of the webhook edge: `source` is the route's source
    /// ([`UNSERVED`] when no plugin serves it), `result` what became of it
    /// (`accepted`, `duplicate`, `refused`, …).
    pub fn delivery(&self, source: &str, status: u16, result: &'static str) {
        self.f
            .deliveries
            .get_or_create(&DeliveryLabels {
                source: source.to_string(),
                status,
                result,
            })
            .inc();
    }

    /// One event this node recorded (or broadcast live): counted by kind,
    /// and read for the figures its kind carries.
    pub fn observe(&self, kind: &str, payload: &Value) {
        let f = &self.f;
        // A module's own topics are the module's business, and unbounded.
        if !kind.starts_with("module.") {
            f.events
                .get_or_create(&KindLabels {
                    kind: kind.to_string(),
                })
                .inc();
        }
        match kind {
            "wake_published" => {
                f.wakes
                    .get_or_create(&WakeLabels {
                        source: text(payload, "source").to_string(),
                        reason: text(payload, "reason").to_string(),
                    })
                    .inc();
            }
            "turn_ended" => {
                let labels = OutcomeLabels {
                    outcome: text(payload, "outcome").to_string(),
                };
                f.turns.get_or_create(&labels).inc();
                f.turn_seconds
                    .get_or_create(&labels)
                    .observe(elapsed(payload));
            }
            "model_call" => {
                let model = text(payload, "model").to_string();
                let labels = ModelLabels {
                    model: model.clone(),
                };
                f.model_calls.get_or_create(&labels).inc();
                f.model_seconds
                    .get_or_create(&labels)
                    .observe(elapsed(payload));
                for (direction, key) in [("input", "input_tokens"), ("output", "output_tokens")] {
                    f.tokens
                        .get_or_create(&TokenLabels {
                            model: model.clone(),
                            direction,
                        })
                        .inc_by(number(payload, key));
                }
            }
            "tool_call" => {
                let ok = payload.get("ok").and_then(Value::as_bool).unwrap_or(false);
                let labels = ToolLabels {
                    tool: text(payload, "tool").to_string(),
                    result: if ok { "ok" } else { "error" },
                };
                f.tool_calls.get_or_create(&labels).inc();
                f.tool_seconds
                    .get_or_create(&labels)
                    .observe(elapsed(payload));
            }
            "budget_exhausted" => {
                f.budget_refusals.inc();
            }
            "reply_posted" => {
                f.replies.inc();
            }
            _ => {}
        }
    }

    /// The node's metrics as OpenMetrics text: this meter's families, then
    /// what each of `collectors` reads at this scrape. Every name starts
    /// with `crewlet_`.
    pub fn render(&self, collectors: Vec<Box<dyn Collector>>) -> String {
        let f = &self.f;
        let mut r = Registry::with_prefix("crewlet");
        r.register(
            "webhook_deliveries",
            "Webhook requests answered, by source, HTTP status and result",
            f.deliveries.clone(),
        );
        r.register(
            "events",
            "Events this node recorded, by kind",
            f.events.clone(),
        );
        r.register(
            "wakes",
            "Wakes published on seats' mailboxes, by source and reason",
            f.wakes.clone(),
        );
        r.register("turns", "Turns ended, by outcome", f.turns.clone());
        r.register(
            "turn_duration_seconds",
            "How long turns ran, by outcome",
            f.turn_seconds.clone(),
        );
        r.register(
            "model_calls",
            "Model calls answered, by model",
            f.model_calls.clone(),
        );
        r.register(
            "model_call_duration_seconds",
            "How long model calls took, by model",
            f.model_seconds.clone(),
        );
        r.register(
            "model_tokens",
            "Tokens the models read (input) and wrote (output), by model",
            f.tokens.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls answered, by tool and result",
            f.tool_calls.clone(),
        );
        r.register(
            "tool_call_duration_seconds",
            "How long tool calls took, by tool and result",
            f.tool_seconds.clone(),
        );
        r.register(
            "budget_refusals",
            "Model calls a budget refused",
            f.budget_refusals.clone(),
        );
        r.register(
            "replies",
            "Replies posted where a trigger asked for one",
            f.replies.clone(),
        );
        for c in collectors {
            r.register_collector(c);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r)
            .expect("writing metrics to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_move_their_counters_and_labels_stay_bounded() {
        let m = Meter::new();
        m.observe(
            "model_call",
            &json!({"model": "m1", "input_tokens": 10, "output_tokens": 3, "ms": 20}),
        );
        m.observe("turn_ended", &json!({"outcome": "delivered", "ms": 1500}));
        m.observe(
            "tool_call",
            &json!({"tool": "chat__post", "ok": true, "us": 400}),
        );
        m.observe("module.notebook.changed", &json!({}));
        m.delivery(UNSERVED, 404, "refused");
        let text = m.render(Vec::new());
        for line in [
            "crewlet_model_calls_total{model=\"m1\"} 1",
            "crewlet_model_tokens_total{model=\"m1\",direction=\"input\"} 10",
            "crewlet_model_tokens_total{model=\"m1\",direction=\"output\"} 3",
            "crewlet_turns_total{outcome=\"delivered\"} 1",
            "crewlet_tool_calls_total{tool=\"chat__post\",result=\"ok\"} 1",
            "crewlet_webhook_deliveries_total{source=\"unserved\",status=\"404\",result=\"refused\"} 1",
            "crewlet_events_total{kind=\"turn_ended\"} 1",
        ] {
            assert!(text.contains(line), "missing {line} in:\n{text}");
        }
        assert!(!text.contains("notebook"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
