//! `/ws/stream` and `GET /events`: reading what the fleet does.
//!
//! The socket speaks JSON text frames. The server pushes
//! `{"kind":"hello"}` once, then `{"kind":"event","event":{…}}` for every
//! event broadcast anywhere in the fleet, and `{"kind":"lagged","missed":N}`
//! if this reader fell more than the live buffer behind. The client may send
//! queries, `{"id":1,"query":"events","seat":…,"type":…,"limit":…}`, each
//! answered by `{"kind":"result","id":1,"events":[…],"coverage":{…},
//! "limit":N,"truncated":bool}` or `{"kind":"error","id":1,"error":"…"}`.
//! Nothing sent on the socket writes.
//!
//! A history read is the fleet's, not this node's: the node behind
//! [`EventSource`] gathers every live node's rows and says in `coverage`
//! which nodes answered and which did not, and in `truncated` whether the
//! `limit` cut the answer. `GET /events` answers that same object. This
//! crate only passes it on: it knows nothing of how the rows are gathered.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::broadcast;

pub use crewlet_bus::EventFilter;

use crate::Shared;

pub type QueryFuture = Pin<Box<dyn Future<Output = Result<serde_json::Value, QueryError>> + Send>>;

/// Why a read of the event log was not answered. The node is to blame,
/// never the asker (whose filter was already read): ask again; a log that
/// stays unreadable is in the node's own log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// This node's store did not answer the read.
    #[error("this node's event log could not be read ({0}); ask again")]
    Unreadable(String),
}

/// Where the surface reads events from. Implemented by the node.
pub trait EventSource: Send + Sync + 'static {
    /// A reader of the live broadcast; `None` until the stream is up.
    fn live(&self) -> Option<broadcast::Receiver<Arc<str>>>;
    /// The fleet's event logs, filtered: answers
    /// `{"events":[…],"coverage":{…},"limit":N,"truncated":bool}`.
    fn query(&self, filter: EventFilter) -> QueryFuture;
}

pub(crate) async fn list_events(
    State(s): State<Shared>,
    Query(filter): Query<EventFilter>,
) -> Response {
    match s.events.query(filter).await {
        Ok(events) => Json(events).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}

/// The socket keeps its connection's slot under the edge's cap for as
/// long as it is open (an upgraded socket outlives its HTTP connection).
pub(crate) async fn ws_stream(
    ws: WebSocketUpgrade,
    slot: Option<axum::Extension<crate::edge::ConnectionSlot>>,
    State(s): State<Shared>,
) -> Response {
    ws.on_upgrade(move |socket| async move {
        let _slot = slot;
        session(socket, s).await
    })
}

#[derive(Deserialize)]
struct Request {
    id: serde_json::Value,
    query: String,
    #[serde(flatten)]
    filter: serde_json::Map<String, serde_json::Value>,
}

async fn session(mut socket: WebSocket, s: Shared) {
    let mut live = s.events.live();
    let mut closing = s.closing.clone();
    if send(
        &mut socket,
        json!({ "kind": "hello", "node": s.probe.health()["node_id"] }),
    )
    .await
    .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    let reply = answer(&s, text.as_str()).await;
                    if send(&mut socket, reply).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    let reply = json!({ "kind": "error", "error": "send queries as JSON text frames" });
                    if send(&mut socket, reply).await.is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            },
            event = next_live(&mut live) => match event {
                Ok(text) => {
                    let Ok(event) = serde_json::from_str::<serde_json::Value>(&text) else {
                        continue;
                    };
                    if send(&mut socket, json!({ "kind": "event", "event": event })).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    if send(&mut socket, json!({ "kind": "lagged", "missed": missed })).await.is_err() {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => live = None,
            },
            _ = until_set(&mut closing) => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
        }
    }
}

/// Resolves once `flag` is `true` (or its sender is gone).
async fn until_set(flag: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = flag.wait_for(|v| *v).await;
}

/// The next live event; pends for ever when there is no feed (yet).
async fn next_live(
    live: &mut Option<broadcast::Receiver<Arc<str>>>,
) -> Result<Arc<str>, broadcast::error::RecvError> {
    match live {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn answer(s: &Shared, text: &str) -> serde_json::Value {
    let req: Request = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            return json!({ "kind": "error", "id": null,
                "error": format!("not a query ({e}); send {{\"id\":1,\"query\":\"events\",…}}") });
        }
    };
    if req.query != "events" {
        return json!({ "kind": "error", "id": req.id,
            "error": format!("unknown query {:?}; this socket answers \"events\" and carries no writes", req.query) });
    }
    let filter: EventFilter = match serde_json::from_value(serde_json::Value::Object(req.filter)) {
        Ok(f) => f,
        Err(e) => return json!({ "kind": "error", "id": req.id, "error": e.to_string() }),
    };
    match s.events.query(filter).await {
        Ok(serde_json::Value::Object(answer)) => {
            let mut frame = serde_json::Map::new();
            frame.insert("kind".into(), json!("result"));
            frame.insert("id".into(), req.id);
            frame.extend(answer);
            serde_json::Value::Object(frame)
        }
        Ok(events) => json!({ "kind": "result", "id": req.id, "events": events }),
        Err(e) => json!({ "kind": "error", "id": req.id, "error": e.to_string() }),
    }
}

async fn send(socket: &mut WebSocket, value: serde_json::Value) -> Result<(), axum::Error> {
    socket.send(Message::Text(value.to_string().into())).await
}
