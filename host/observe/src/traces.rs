//! Traces: a span per webhook, turn, model call and tool call, exported
//! over OTLP/HTTP (protobuf) when `[telemetry] otlp_endpoint` names a
//! collector; off by default.
//!
//! Rules, and why:
//! - **Spans are made from the events this node records** (the
//!   [`crate::Publisher`] hands each to [`Traces::observe`]), so a span can
//!   never disagree with the event log, and its trace id is the one the
//!   webhook edge minted — every event of a delivery's work carries it,
//!   on whichever node the work ran.
//! - **Span ids are derived, not remembered**: a turn's span id is a hash
//!   of its turn id, so its model and tool calls name it as their parent
//!   from their own events, with no state kept between events. A webhook's
//!   span is the trace's root; a turn is a root of its own in the same
//!   trace (it may batch several deliveries, or come from a schedule).
//! - **Export never slows the work**: `observe` only queues (bounded); a
//!   full queue drops the span and counts it; one task batches and exports,
//!   and a failed export is logged (once per run of failures) and dropped.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use crewlet_store::EventRecord;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::{info, warn};

/// Spans waiting for export; past it a span is dropped (and counted).
const QUEUE: usize = 4096;
/// The most spans one export carries.
const BATCH: usize = 512;
/// How long a span waits for its batch to fill.
const LINGER: Duration = Duration::from_secs(1);
/// One export's bound.
const EXPORT_WITHIN: Duration = Duration::from_secs(5);

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot export traces to {endpoint}: {reason}; check [telemetry] otlp_endpoint")]
pub struct TracesError {
    endpoint: String,
    reason: String,
}

/// The span feed: cheap to clone, never blocks.
#[derive(Clone, Debug)]
pub struct Traces {
    tx: mpsc::Sender<SpanData>,
    dropped: Arc<AtomicU64>,
}

impl Traces {
    /// Starts the export task for `endpoint` (an OTLP/HTTP base URL; spans
    /// go to its `/v1/traces`); it ends when every clone is dropped.
    pub fn start(endpoint: &str, node_id: &str) -> Result<Traces, TracesError> {
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_WITHIN)
            .build()
            .map_err(|e| TracesError {
                endpoint: url.clone(),
                reason: e.to_string(),
            })?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name("crewlet")
                .with_attributes([KeyValue::new("service.instance.id", node_id.to_string())])
                .build(),
        );
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        tokio::spawn(export(exporter, rx, url, dropped.clone()));
        Ok(Traces { tx, dropped })
    }

    /// Queues the span `event` stands for, if its kind has one.
    pub fn observe(&self, event: &EventRecord) {
        let Some(span) = span_of(event) else { return };
        if self.tx.try_send(span).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn export(
    exporter: opentelemetry_otlp::SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
    url: String,
    dropped: Arc<AtomicU64>,
) {
    let failing = AtomicBool::new(false);
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let linger = tokio::time::sleep(LINGER);
        tokio::pin!(linger);
        while batch.len() < BATCH {
            tokio::select! {
                next = rx.recv() => match next {
                    Some(span) => batch.push(span),
                    None => break,
                },
                () = &mut linger => break,
            }
        }
        let n = batch.len();
        match exporter.export(std::mem::take(&mut batch)).await {
            Ok(()) => {
                if failing.swap(false, Ordering::Relaxed) {
                    info!(subsystem = "traces", %url, "span export works again");
                }
            }
            Err(e) => {
                if !failing.swap(true, Ordering::Relaxed) {
                    warn!(subsystem = "traces", %url, spans = n, error = %e,
                        "span export failed; these spans are dropped, and further failures are not logged until one succeeds");
                }
            }
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            warn!(
                subsystem = "traces",
                spans = lost,
                "the span queue was full; spans dropped"
            );
        }
    }
}

/// 8 bytes of SHA-256 over `parts`: a span id anyone holding the same
/// names derives.
fn span_id(parts: &[&str]) -> SpanId {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    let d = h.finalize();
    let mut id = [0u8; 8];
    id.copy_from_slice(&d[..8]);
    if id == [0; 8] {
        id[7] = 1;
    }
    SpanId::from_bytes(id)
}

/// The event's trace: the minted id (a UUID, whose 128 bits are a W3C trace
/// id once its dashes are dropped), else one derived from the event's own id.
fn trace_id(event: &EventRecord) -> TraceId {
    if let Some(t) = &event.trace_id
        && let Ok(id) = TraceId::from_hex(&t.replace('-', ""))
        && id != TraceId::INVALID
    {
        return id;
    }
    let d = Sha256::digest(event.event_id.as_bytes());
    let mut id = [0u8; 16];
    id.copy_from_slice(&d[..16]);
    TraceId::from_bytes(id)
}

fn text(payload: &Value, key: &str) -> String {
    payload
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn number(payload: &Value, key: &str) -> i64 {
    payload.get(key).and_then(Value::as_i64).unwrap_or(0)
}

/// The span an event stands for: `webhook_received`, `turn_ended`,
/// `model_call` and `tool_call` have one; no other kind does.
pub fn span_of(event: &EventRecord) -> Option<SpanData> {
    let p = &event.payload;
    let trace = trace_id(event);
    let trace_hex = trace.to_string();
    let turn = text(p, "turn_id");
    let (name, id, parent, kind, took, mut attributes): (String, _, _, _, _, Vec<KeyValue>) =
        match event.kind.as_str() {
            "webhook_received" => (
                format!("webhook {}", text(p, "source")),
                span_id(&["webhook", &trace_hex, &text(p, "delivery_id")]),
                SpanId::INVALID,
                SpanKind::Server,
                Duration::from_millis(number(p, "ms").max(0) as u64),
                vec![
                    KeyValue::new("crewlet.source", text(p, "source")),
                    KeyValue::new("crewlet.event_type", text(p, "event_type")),
                    KeyValue::new("crewlet.delivery_id", text(p, "delivery_id")),
                ],
            ),
            "turn_ended" => (
                format!("turn {}", event.seat.as_deref().unwrap_or("")),
                span_id(&["turn", &turn]),
                SpanId::INVALID,
                SpanKind::Internal,
                Duration::from_millis(number(p, "ms").max(0) as u64),
                vec![
                    KeyValue::new("crewlet.turn_id", turn.clone()),
                    KeyValue::new("crewlet.outcome", text(p, "outcome")),
                    KeyValue::new("crewlet.model_calls", number(p, "model_calls")),
                    KeyValue::new("crewlet.tool_calls", number(p, "tool_calls")),
                    KeyValue::new("crewlet.replies", number(p, "replies")),
                ],
            ),
            "model_call" => (
                format!("model {}", text(p, "model")),
                span_id(&["model", &event.event_id]),
                span_id(&["turn", &turn]),
                SpanKind::Client,
                Duration::from_millis(number(p, "ms").max(0) as u64),
                vec![
                    KeyValue::new("crewlet.model", text(p, "model")),
                    KeyValue::new("crewlet.phase", text(p, "phase")),
                    KeyValue::new("crewlet.input_tokens", number(p, "input_tokens")),
                    KeyValue::new("crewlet.output_tokens", number(p, "output_tokens")),
                ],
            ),
            "tool_call" => (
                format!("tool {}", text(p, "tool")),
                span_id(&["tool", &event.event_id]),
                span_id(&["turn", &turn]),
                SpanKind::Client,
                Duration::from_micros(number(p, "us").max(0) as u64),
                vec![KeyValue::new("crewlet.tool", text(p, "tool"))],
            ),
            _ => return None,
        };
    attributes.push(KeyValue::new("crewlet.node", event.node_id.clone()));
    if let Some(seat) = &event.seat {
        attributes.push(KeyValue::new("crewlet.seat", seat.clone()));
    }
    let status = match p.get("ok").and_then(Value::as_bool) {
        Some(false) => Status::error("the tool answered an error"),
        _ => Status::Unset,
    };
    let end = UNIX_EPOCH + Duration::from_millis(event.at_ms.max(0) as u64);
    Some(SpanData {
        span_context: SpanContext::new(
            trace,
            id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: kind,
        name: Cow::Owned(name),
        start_time: end.checked_sub(took).unwrap_or(end),
        end_time: end,
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: InstrumentationScope::builder("crewlet").build(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::SystemTime;

    fn at(ms: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    }

    fn event(kind: &str, trace: &str, payload: Value) -> EventRecord {
        let mut e = EventRecord::new(format!("ev-{kind}"), kind, "node-a", payload);
        e.trace_id = Some(trace.to_string());
        e.seat = Some("ada".into());
        e.at_ms = 10_000;
        e
    }

    #[test]
    fn a_turns_calls_are_its_children_in_the_minted_trace() {
        // Minted ids are UUIDs; the trace is their 32 hex digits.
        let minted = "01234567-89ab-cdef-0123-456789abcdef";
        let trace = "0123456789abcdef0123456789abcdef";
        let turn = span_of(&event(
            "turn_ended",
            minted,
            json!({"turn_id": "t1", "outcome": "delivered", "ms": 400}),
        ))
        .unwrap();
        let model = span_of(&event(
            "model_call",
            minted,
            json!({"turn_id": "t1", "model": "scripted/demo", "ms": 30}),
        ))
        .unwrap();
        let tool = span_of(&event(
            "tool_call",
            minted,
            json!({"turn_id": "t1", "tool": "chat__post", "ok": false, "us": 1500}),
        ))
        .unwrap();
        assert_eq!(turn.span_context.trace_id().to_string(), trace);
        assert_eq!(model.parent_span_id, turn.span_context.span_id());
        assert_eq!(tool.parent_span_id, turn.span_context.span_id());
        assert_eq!(turn.start_time, at(9_600));
        assert_eq!(tool.start_time + Duration::from_micros(1500), at(10_000));
        assert_eq!(tool.status, Status::error("the tool answered an error"));
        assert_eq!(model.name, "model scripted/demo");
        assert!(span_of(&event("wake_published", trace, json!({}))).is_none());
    }

    #[test]
    fn an_event_without_a_minted_trace_still_gets_a_valid_one() {
        let mut e = event("webhook_received", "not-hex", json!({"source": "slack"}));
        let span = span_of(&e).unwrap();
        assert_ne!(span.span_context.trace_id(), TraceId::INVALID);
        e.trace_id = None;
        assert_eq!(
            span_of(&e).unwrap().span_context.trace_id(),
            span.span_context.trace_id()
        );
    }
}
