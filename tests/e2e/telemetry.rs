//! What a node tells an operator's tools, through the real binary, on one
//! node with `[telemetry] otlp_endpoint` set:
//! - `GET /metrics` parsed by the Prometheus project's own OpenMetrics
//!   parser (the Python `prometheus-client`, which `scripts/bootstrap.sh
//!   --browser` installs into `.tools/venv`), its counters moving after a
//!   turn, a refusal and a stranger's route, behind the operator guard;
//! - spans exported over OTLP/HTTP to a receiver built on the
//!   OpenTelemetry project's protocol crate (`crewlet_testkit::otlp`): the
//!   webhook, the turn, its model and tool calls, in the minted trace.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::company::SCRIPTED_COMPANY;
use crate::common::{self, eventually};
use crate::turns;
use crewlet_testkit::otlp::{OtlpReceiver, ReceivedSpan};

/// One sample: its name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        print(json.dumps([s.name, s.labels, s.value]))
"#;

/// `text` through the official parser; panics (with the text) when it
/// does not parse.
fn parse(text: &str) -> Vec<Sample> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/venv/bin/python");
    let mut child = Command::new(&python)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run scripts/bootstrap.sh --browser",
                python.display()
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, labels, value): (String, BTreeMap<String, String>, f64) =
                serde_json::from_str(l).unwrap();
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

struct Scrape(Vec<Sample>);

impl Scrape {
    /// The sum of `name`'s samples whose labels include every `(k, v)`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    fn has_label_value(&self, value: &str) -> bool {
        self.0.iter().any(|s| s.labels.values().any(|v| v == value))
    }
}

fn scrape(node: &common::Node) -> Scrape {
    let r = node.get("/metrics").expect("/metrics answers");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/openmetrics-text")),
        "{:?}",
        r.header("content-type")
    );
    Scrape(parse(&r.text()))
}

#[test]
fn metrics_and_spans_follow_a_delivery_through_its_turn() {
    let receiver = OtlpReceiver::start();
    let w = turns::start_with(
        SCRIPTED_COMPANY,
        None,
        &[],
        &format!("[telemetry]\notlp_endpoint = \"{}\"\n", receiver.endpoint()),
    );

    // Behind the guard: no token, no metrics.
    let bare = crewlet_testkit::http::request_exact(
        &w.node.api,
        "GET",
        "/metrics",
        &[("Host", &w.node.api)],
        b"",
    )
    .unwrap();
    assert_eq!(bare.status, 401, "{}", bare.text());

    let before = scrape(&w.node);
    w.mention("ada", "EvM1", "C9", "9.1", "<@ada> demo");
    w.wait_events("turn_ended", 1);
    // A refusal (a wrong signature) and a stranger's route.
    let bad = crewlet_testkit::http::post(
        &w.node.api,
        "/webhooks/slack/ada",
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", "1"),
            ("X-Slack-Signature", "v0=00"),
        ],
        b"{}",
    )
    .unwrap();
    assert_eq!(bad.status, 401, "{}", bad.text());
    let stranger =
        crewlet_testkit::http::post(&w.node.api, "/webhooks/zz-stranger-route", &[], b"{}")
            .unwrap();
    assert_eq!(stranger.status, 404, "{}", stranger.text());

    // Renewals come on the 1 s heartbeat; wait for the first.
    let mut after = scrape(&w.node);
    assert!(
        eventually(Duration::from_secs(20), || {
            after = scrape(&w.node);
            after.sum("crewlet_lease_renewals_total", &[("answer", "yes")]) > 0.0
        }),
        "no lease renewal counted"
    );

    let moved =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    assert_eq!(
        moved("crewlet_turns_total", &[("outcome", "delivered")]),
        1.0
    );
    assert_eq!(
        after.sum(
            "crewlet_turn_duration_seconds_count",
            &[("outcome", "delivered")]
        ),
        1.0
    );
    assert!(moved("crewlet_model_calls_total", &[]) >= 1.0);
    assert!(
        after
            .0
            .iter()
            .filter(|s| s.name == "crewlet_model_calls_total")
            .all(|s| s.labels["model"].starts_with("scripted/")),
        "models are named"
    );
    assert!(moved("crewlet_tool_calls_total", &[("result", "ok")]) >= 1.0);
    assert_eq!(moved("crewlet_wakes_total", &[("source", "slack")]), 1.0);
    assert_eq!(moved("crewlet_replies_total", &[]), 1.0);
    for (status, result) in [("202", "accepted"), ("401", "refused")] {
        assert_eq!(
            moved(
                "crewlet_webhook_deliveries_total",
                &[("source", "slack"), ("status", status), ("result", result)]
            ),
            1.0,
            "{status} {result}"
        );
    }
    assert_eq!(
        moved(
            "crewlet_webhook_deliveries_total",
            &[("source", "unserved"), ("status", "404")]
        ),
        1.0
    );
    assert!(
        !after.has_label_value("zz-stranger-route"),
        "a stranger's route never becomes a label value"
    );
    // Slack's plugin ran verify and parse for the mention, verify for the
    // refusal; every call that ran is timed.
    let slack = [("plugin", "slack"), ("kind", "webhook")];
    assert!(moved("crewlet_plugin_calls_total", &slack) >= 3.0);
    assert_eq!(
        after.sum("crewlet_plugin_calls_total", &slack),
        after.sum("crewlet_plugin_call_duration_seconds_count", &slack)
    );
    assert_eq!(after.sum("crewlet_plugin_faults_total", &slack), 0.0);
    assert_eq!(after.sum("crewlet_broker_connected", &[]), 1.0);
    assert!(after.sum("crewlet_seats_held", &[]) >= 1.0);
    assert!(moved("crewlet_events_total", &[("kind", "turn_ended")]) >= 1.0);

    spans_of_the_turn(&w, &receiver);
}

/// The delivery's spans: the webhook as the trace's root, the turn in the
/// same trace, its model and tool calls as the turn's children, each
/// with its node and timing.
fn spans_of_the_turn(w: &turns::World, receiver: &OtlpReceiver) {
    let received = w.events("webhook_received");
    // The minted id is a UUID; its 32 hex digits are the OTLP trace id.
    let trace = received[0]["trace_id"].as_str().unwrap().replace('-', "");
    let turn_id = w.events("turn_ended")[0]["payload"]["turn_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut spans: Vec<ReceivedSpan> = Vec::new();
    // Batches leave the node within a second of their first span.
    assert!(
        eventually(Duration::from_secs(30), || {
            spans = receiver.spans();
            spans.iter().any(|s| s.name.starts_with("webhook"))
                && spans.iter().any(|s| s.name.starts_with("turn"))
                && spans.iter().any(|s| s.name.starts_with("model"))
                && spans.iter().any(|s| s.name.starts_with("tool"))
        }),
        "spans received: {spans:#?}"
    );
    let webhook = spans.iter().find(|s| s.name == "webhook slack").unwrap();
    assert_eq!(webhook.trace_id, trace, "the minted trace id");
    assert_eq!(webhook.parent_span_id, "", "the trace's root");
    assert_eq!(webhook.attributes["crewlet.source"], "slack");
    let turn = spans
        .iter()
        .find(|s| s.attributes.get("crewlet.turn_id") == Some(&turn_id))
        .unwrap();
    assert_eq!(turn.trace_id, trace);
    assert_eq!(turn.name, "turn ada");
    assert_eq!(turn.attributes["crewlet.outcome"], "delivered");
    assert!(turn.start_unix_nano < turn.end_unix_nano);
    let children: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id == turn.span_id)
        .collect();
    assert!(
        children
            .iter()
            .any(|s| s.name.starts_with("model scripted/")),
        "{children:#?}"
    );
    assert!(
        children.iter().any(|s| s.name == "tool chat__post_message"),
        "{children:#?}"
    );
    for s in &children {
        assert_eq!(s.trace_id, trace);
        // Inside the turn, to the events' millisecond clock.
        let slack = 2_000_000;
        assert!(
            turn.start_unix_nano <= s.start_unix_nano + slack
                && s.end_unix_nano <= turn.end_unix_nano + slack,
            "{s:#?} inside {turn:#?}"
        );
    }
    let node_id = w.node.health()["node_id"].as_str().unwrap().to_string();
    assert!(spans.iter().all(|s| s.service_instance == node_id));
}
