//! A real OTLP/HTTP trace receiver for tests: `POST /v1/traces` with a
//! protobuf `ExportTraceServiceRequest`, decoded by the OpenTelemetry
//! project's own protocol crate (`opentelemetry-proto`), answered with an
//! `ExportTraceServiceResponse`, every span kept for the test to read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// One span as received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// Lower-case hex, as `Crewlet-Trace-Id` carries it.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// Attribute values as text.
    pub attributes: BTreeMap<String, String>,
    /// The resource's `service.instance.id`.
    pub service_instance: String,
}

type Spans = Arc<Mutex<Vec<ReceivedSpan>>>;

/// The running receiver; dropping it stops it.
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Spans,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts on a free loopback port.
    pub fn start() -> OtlpReceiver {
        let spans = Spans::default();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = spans.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("otlp-receiver runtime");
                rt.block_on(async move {
                    let listener = crate::openai::bind().await;
                    let _ = addr_tx.send(listener.local_addr().expect("local addr"));
                    let app = Router::new()
                        .route("/v1/traces", post(traces))
                        .with_state(state);
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stop_rx.await;
                        })
                        .await;
                });
            })
            .expect("start the otlp-receiver thread");
        let addr = addr_rx.recv().expect("the otlp receiver bound");
        OtlpReceiver {
            addr,
            spans,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`: what `[telemetry] otlp_endpoint` names.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().expect("spans").clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

async fn traces(State(spans): State<Spans>, body: axum::body::Bytes) -> Response {
    let req = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not OTLP: {e}")).into_response(),
    };
    let mut got = Vec::new();
    for rs in req.resource_spans {
        let instance = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.instance.id")
            .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(ReceivedSpan {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    start_unix_nano: s.start_time_unix_nano,
                    end_unix_nano: s.end_time_unix_nano,
                    attributes: s
                        .attributes
                        .into_iter()
                        .map(|kv| {
                            (
                                kv.key,
                                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                            )
                        })
                        .collect(),
                    service_instance: instance.clone(),
                });
            }
        }
    }
    spans.lock().expect("spans").extend(got);
    (
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}
