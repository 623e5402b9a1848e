//! `ScriptedOpenAi`: a real local HTTP server speaking the OpenAI
//! chat-completions and embeddings wire formats, answering what the test
//! scripted.
//!
//! The only double in the model path, and it sits outside the boundary: the
//! provider plugin under test sends real HTTP and parses real responses.
//! Rules, and why:
//! - Replies are queued per model, first in first out, so a test that drives
//!   a fallback chain says what each model answers, in order.
//! - An empty queue answers 500 with a body that says so: a test that forgot
//!   a reply fails loudly rather than hanging or passing by accident.
//! - Every request is recorded (model, bearer key, messages, tools) so a
//!   test can assert what was sent, and what was never sent.
//! - A text answer honours the request's `max_tokens` as a vendor does: cut
//!   there, `finish_reason: length`, usage counting what was sent.
//! - The server runs on its own thread and runtime, so it works from any
//!   test (sync or async, any flavour) and outlives none: dropping the
//!   handle stops it and joins the thread.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// What the server answers one request for a model.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `200` with an assistant message saying this.
    Text(String),
    /// `200` with these tool calls: `(tool name, arguments object)`.
    ToolCalls(Vec<(String, Value)>),
    /// `200` from `/v1/embeddings` with these vectors as `data[]` (listed
    /// last first, each item's `index` saying its place, as the wire
    /// allows); usage counts a quarter of the inputs' characters.
    Vectors(Vec<Vec<f32>>),
    /// Any status with this raw body, and a `Retry-After` (seconds) when given.
    Status {
        code: u16,
        retry_after: Option<u64>,
        body: String,
    },
    /// This reply, after a wait: a slow model, so a test can act while a
    /// turn is in its model call.
    Delayed(std::time::Duration, Box<Reply>),
    /// This reply once the test opens the gate: a model call that lasts
    /// exactly until the test has seen what it waits for.
    Held(Gate, Box<Reply>),
    /// This reply, its usage reported as these token counts whatever was
    /// sent: a vendor whose tokenizer counts more than the client's
    /// estimate, or that bills past the request's `max_tokens`.
    Billed {
        input: u64,
        output: u64,
        reply: Box<Reply>,
    },
}

/// Holds a [`Reply::Held`] answer until [`Gate::open`]; open stays open.
/// Made by [`ScriptedOpenAi::gate`], which opens it when dropped, so a test
/// that fails before opening it does not leave the server waiting.
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Gate {
    /// Lets every reply held at this gate go, now and later.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn passed(&self) {
        // The sender lives in `self`, so the wait ends only when opened.
        let _ = self.0.subscribe().wait_for(|open| *open).await;
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Gate) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Reply {
    /// `reply`, billed as `input` and `output` tokens.
    pub fn billed(input: u64, output: u64, reply: Reply) -> Reply {
        Reply::Billed {
            input,
            output,
            reply: Box::new(reply),
        }
    }

    /// A 429 in OpenAI's shape, advising `retry_after` seconds.
    pub fn rate_limited(retry_after: u64) -> Reply {
        Reply::Status {
            code: 429,
            retry_after: Some(retry_after),
            body: error_body("Rate limit reached; try again later", "rate_limit_exceeded"),
        }
    }

    /// An error status in OpenAI's shape with this message.
    pub fn error(code: u16, message: &str) -> Reply {
        Reply::Status {
            code,
            retry_after: None,
            body: error_body(message, "scripted_error"),
        }
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    /// The body's `model` (empty when the body was not JSON).
    pub model: String,
    /// The key after `Bearer ` in `Authorization`, if any.
    pub bearer: Option<String>,
    /// The body's `messages` array (`null` when absent).
    pub messages: Value,
    /// The body's `tools` array (`null` when absent).
    pub tools: Value,
    /// The path asked: `/v1/chat/completions` or `/v1/embeddings`.
    pub path: &'static str,
    /// The whole body as JSON (`null` when it was not JSON).
    pub body: Value,
    /// The `x-request-id` the server answered with.
    pub request_id: String,
    /// When the request's body had arrived (the server's clock, which is
    /// the test process's).
    pub at: std::time::Instant,
    /// The client's end of the connection the request came on: two
    /// requests from one address came over one kept connection.
    pub peer: SocketAddr,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<HashMap<String, VecDeque<Reply>>>,
    seen: Mutex<Vec<SeenRequest>>,
    gates: Mutex<Vec<Gate>>,
}

/// The running server; dropping it stops the server.
pub struct ScriptedOpenAi {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ScriptedOpenAi {
    /// Starts the server on a free loopback port.
    pub fn start() -> ScriptedOpenAi {
        let shared = Arc::new(Shared::default());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("scripted-openai".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("scripted-openai runtime");
                rt.block_on(async move {
                    let listener = bind().await;
                    let _ = addr_tx.send(listener.local_addr().expect("local addr"));
                    let app = Router::new()
                        .route("/v1/chat/completions", post(completions))
                        .route("/v1/embeddings", post(embeddings))
                        .with_state(state);
                    let app = app.into_make_service_with_connect_info::<SocketAddr>();
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = stop_rx.await;
                        })
                        .await;
                });
            })
            .expect("start the scripted-openai thread");
        let addr = addr_rx.recv().expect("the scripted-openai server bound");
        ScriptedOpenAi {
            addr,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT/v1`: the manifest's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT`: the manifest's `allowed_outbound_hosts` entry.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A shut gate for [`Reply::Held`].
    pub fn gate(&self) -> Gate {
        let gate = Gate(Arc::new(tokio::sync::watch::channel(false).0));
        self.shared.gates.lock().expect("gates").push(gate.clone());
        gate
    }

    /// Queues `reply` as the next answer for `model`.
    pub fn reply(&self, model: &str, reply: Reply) {
        self.shared
            .queues
            .lock()
            .expect("reply queues")
            .entry(model.to_owned())
            .or_default()
            .push_back(reply);
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.shared.seen.lock().expect("seen requests").clone()
    }

    /// How many requests have been received (without copying them: a
    /// benchmark polling `requests()` would copy every body each time and
    /// slow the machine it measures).
    pub fn request_count(&self) -> usize {
        self.shared.seen.lock().expect("seen requests").len()
    }

    /// The requests received from the `from`-th on, oldest first.
    pub fn requests_from(&self, from: usize) -> Vec<SeenRequest> {
        let seen = self.shared.seen.lock().expect("seen requests");
        seen.get(from..).map(<[_]>::to_vec).unwrap_or_default()
    }

    /// Replies still queued for `model`.
    pub fn pending(&self, model: &str) -> usize {
        self.shared
            .queues
            .lock()
            .expect("reply queues")
            .get(model)
            .map_or(0, VecDeque::len)
    }
}

impl Drop for ScriptedOpenAi {
    fn drop(&mut self) {
        for gate in self.shared.gates.lock().expect("gates").iter() {
            gate.open();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) async fn bind() -> tokio::net::TcpListener {
    let mut last = None;
    for _ in 0..20 {
        match tokio::net::TcpListener::bind(("127.0.0.1", crate::free_port())).await {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
    }
    panic!("no free loopback port: {last:?}");
}

fn error_body(message: &str, code: &str) -> String {
    json!({"error": {"message": message, "type": "scripted", "code": code}}).to_string()
}

/// A character count / 4, at least 1: usage the test can predict.
fn tokens(chars: usize) -> u64 {
    (chars as u64 / 4).max(1)
}

/// Records a request on `path` and takes the reply queued for its model,
/// unwrapping any delay and billing: `(request number, parsed body, the
/// reply, the billed counts)`.
async fn take(
    shared: &Shared,
    path: &'static str,
    peer: SocketAddr,
    headers: &HeaderMap,
    body: &[u8],
) -> (usize, Value, Option<Reply>, Option<(u64, u64)>) {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let model = parsed["model"].as_str().unwrap_or_default().to_owned();
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let (n, reply) = {
        let mut seen = shared.seen.lock().expect("seen requests");
        let n = seen.len() + 1;
        let request_id = format!("req-{n}");
        seen.push(SeenRequest {
            model: model.clone(),
            bearer,
            messages: parsed["messages"].clone(),
            tools: parsed["tools"].clone(),
            path,
            body: parsed.clone(),
            request_id,
            at: std::time::Instant::now(),
            peer,
        });
        let reply = shared
            .queues
            .lock()
            .expect("reply queues")
            .get_mut(&model)
            .and_then(VecDeque::pop_front);
        (n, reply)
    };
    let mut reply = reply;
    let mut billed = None;
    loop {
        match reply {
            Some(Reply::Delayed(wait, inner)) => {
                tokio::time::sleep(wait).await;
                reply = Some(*inner);
            }
            Some(Reply::Held(gate, inner)) => {
                gate.passed().await;
                reply = Some(*inner);
            }
            Some(Reply::Billed {
                input,
                output,
                reply: inner,
            }) => {
                billed = Some((input, output));
                reply = Some(*inner);
            }
            _ => break,
        }
    }
    (n, parsed, reply, billed)
}

/// The reply to give, or the answer already due: a 500 saying none was
/// queued, or the scripted status.
fn scripted(reply: Option<Reply>, model: &str, request_id: &str) -> Result<Reply, Box<Response>> {
    match reply {
        None => Err(Box::new(respond(
            500,
            None,
            request_id,
            error_body(
                &format!(
                    "ScriptedOpenAi has no reply queued for model {model:?}: push one with reply()"
                ),
                "no_scripted_reply",
            ),
        ))),
        Some(Reply::Status {
            code,
            retry_after,
            body,
        }) => Err(Box::new(respond(code, retry_after, request_id, body))),
        Some(reply) => Ok(reply),
    }
}

/// A 500 for a reply queued for the other endpoint.
fn wrong(request_id: &str, what: &str) -> Response {
    respond(
        500,
        None,
        request_id,
        error_body(&format!("ScriptedOpenAi: {what}"), "wrong_scripted_reply"),
    )
}

async fn completions(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (n, parsed, reply, billed) =
        take(&shared, "/v1/chat/completions", peer, &headers, &body).await;
    let model = parsed["model"].as_str().unwrap_or_default().to_owned();
    let request_id = format!("req-{n}");
    if parsed.is_null() {
        return respond(
            400,
            None,
            &request_id,
            error_body("the body is not JSON", "invalid_json"),
        );
    }
    let prompt_chars: usize = parsed["messages"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| m["content"].as_str().map_or(0, |c| c.chars().count()))
                .sum()
        })
        .unwrap_or(0);
    let reply = match scripted(reply, &model, &request_id) {
        Ok(reply) => reply,
        Err(answer) => return *answer,
    };
    let (message, finish, answer_chars) = match reply {
        Reply::Status { .. } | Reply::Delayed(..) | Reply::Held(..) | Reply::Billed { .. } => {
            unreachable!("answered or unwrapped above")
        }
        Reply::Vectors(_) => {
            return wrong(&request_id, "vectors were queued for a chat completion");
        }
        // A text longer than the request's `max_tokens` is cut there, as a
        // vendor does (`finish_reason: length`).
        Reply::Text(text) => match parsed["max_tokens"].as_u64() {
            Some(max) if tokens(text.chars().count()) > max => {
                let cut: String = text.chars().take(max as usize * 4).collect();
                let chars = cut.chars().count();
                (
                    json!({"role": "assistant", "content": cut}),
                    "length",
                    chars,
                )
            }
            _ => {
                let chars = text.chars().count();
                (json!({"role": "assistant", "content": text}), "stop", chars)
            }
        },
        Reply::ToolCalls(calls) => {
            let mut chars = 0;
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| {
                    let arguments = args.to_string();
                    chars += name.chars().count() + arguments.chars().count();
                    json!({"id": format!("call_{n}_{i}"), "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
            (
                json!({"role": "assistant", "content": null, "tool_calls": calls}),
                "tool_calls",
                chars,
            )
        }
    };
    let (input, output) = billed.unwrap_or((tokens(prompt_chars), tokens(answer_chars)));
    let body = json!({
        "id": format!("chatcmpl-{n}"),
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
    });
    respond(200, None, &request_id, body.to_string())
}

async fn embeddings(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (n, parsed, reply, billed) = take(&shared, "/v1/embeddings", peer, &headers, &body).await;
    let model = parsed["model"].as_str().unwrap_or_default().to_owned();
    let request_id = format!("req-{n}");
    let vectors = match scripted(reply, &model, &request_id) {
        Ok(Reply::Vectors(vectors)) => vectors,
        Ok(_) => return wrong(&request_id, "a chat reply was queued for an embedding"),
        Err(answer) => return *answer,
    };
    let input_chars: usize = parsed["input"]
        .as_array()
        .map(|xs| {
            xs.iter()
                .map(|x| x.as_str().map_or(0, |t| t.chars().count()))
                .sum()
        })
        .unwrap_or(0);
    let input = billed.map_or(tokens(input_chars), |(input, _)| input);
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .rev()
        .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
        .collect();
    let body = json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": input, "total_tokens": input},
    });
    respond(200, None, &request_id, body.to_string())
}

fn respond(code: u16, retry_after: Option<u64>, request_id: &str, body: String) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    let h = response.headers_mut();
    h.insert("content-type", HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-request-id", v);
    }
    if let Some(s) = retry_after {
        h.insert("retry-after", HeaderValue::from(s));
    }
    response
}
