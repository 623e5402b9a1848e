//! The company chat (`docs/chat.md`): `crewlet-api`'s chat routes over the
//! `chat` module, the hand-off of each post to the webhook edge, the chat
//! signing secret, and each seat's chat credential. The node reaches in
//! through [`ChatNode`] (its engine once up: the secrets, the active
//! company, the `chat` module; and its one webhook edge), so this crate
//! never builds the node.
//!
//! Rules, and why:
//! - **Stored, then delivered, through the product's own parts.** A post is
//!   written by the `chat` module (its buckets are the fleet's), then signed
//!   with the company's chat secret and served by this node's webhook edge
//!   at `/webhooks/chat` exactly as an HTTP delivery is (verify → parse →
//!   claim → publish), so mentions, follows and the sender rule are the
//!   plugin's and notify's, not this file's. A message handed in twice
//!   (a retried post) is claimed once: its delivery id is the message id.
//! - **The author is the caller**, never the body: a seat's credential is
//!   that seat; an operator token posts under its name, and a token named
//!   as a seat of the company is refused (a person never posts as a seat).
//! - **A seat's credential is minted, not stored**: an HMAC of the handle
//!   under the chat signing secret, so every node mints and checks the same
//!   one with no record to keep; it is good on `/chat/` routes only
//!   (`crewlet_api::Verdict::Seat`).
//! - **The secret is made once**: the first node that starts without one
//!   writes it, create-only, so two nodes starting together agree.

use std::sync::Arc;
use std::time::Duration;

use crewlet_api::chat::{ChatFuture, PostBody, Posted, ReadQuery, WorkingBody};
use crewlet_api::{Authority, Caller, ChatRefusal, ChatRoom, Refused, Verdict};
use crewlet_ingress::Outcome;
use crewlet_plugins::module::{ModulePlugin, ModuleRefusal, ToolCaller, ToolError};
use crewlet_secrets::{Lookup, Secrets};
use http::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{info, warn};

use crewlet_company::ActiveCompany;
use crewlet_ingress::Edge;

/// What the chat reads of the node's engine once it is up.
pub struct Engine<'a> {
    pub secrets: &'a Secrets,
    pub active: &'a ActiveCompany,
    /// The `chat` module, when this node runs it.
    pub module: Option<Arc<ModulePlugin>>,
}

/// The node as the chat reaches it: its engine (`None` while it starts)
/// and its one webhook edge (`None` until the ingress is up).
pub trait ChatNode: Send + Sync {
    fn engine(&self) -> Option<Engine<'_>>;
    fn edge(&self) -> Option<&Arc<Edge>>;
}

/// The module and the webhook source of the chat.
pub const CHAT: &str = "chat";
/// The signing secret the node makes at first start.
pub const SECRET: &str = "chat_signing_secret";
/// `${CREWLET_CHAT_TOKEN}` in a server's template: the seat's credential.
pub const TOKEN_VARIABLE: &str = "CREWLET_CHAT_TOKEN";
/// `${CREWLET_CHAT_URL}` in a server's template: this node's API.
pub const URL_VARIABLE: &str = "CREWLET_CHAT_URL";
/// How a seat's credential starts: `crewlet-chat.HANDLE.HEX`.
const SEAT_PREFIX: &str = "crewlet-chat.";
/// What an operator token with no usable name posts as.
const OPERATOR: &str = "operator";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Seat `handle`'s chat credential under `secret`.
pub fn seat_credential(secret: &str, handle: &str) -> String {
    let mac = crewlet_ingress::sign::hmac_sha256(
        secret.as_bytes(),
        format!("crewlet-chat-seat:{handle}").as_bytes(),
    );
    format!("{SEAT_PREFIX}{handle}.{}", hex(&mac))
}

/// `${CREWLET_CHAT_TOKEN}` for seat `handle`, through `resolve` (the
/// secret unknown or unset answers the same of the credential).
pub fn seat_token(resolve: &crewlet_secrets::Resolver, handle: &str) -> Lookup {
    match resolve.lookup(SECRET) {
        Lookup::Found(secret) => Lookup::Found(seat_credential(&secret, handle)),
        other => other,
    }
}

/// `${CREWLET_CHAT_URL}`: this node's API as a seat's child reaches it.
pub fn api_url(config: &crewlet_config::NodeConfig) -> String {
    let host = match config.api.host {
        h if h.is_unspecified() => "127.0.0.1".to_owned(),
        std::net::IpAddr::V6(h) => format!("[{h}]"),
        h => h.to_string(),
    };
    format!("http://{host}:{}", config.api.port)
}

/// The guard's judge: a seat's chat credential, else an operator token.
pub struct Callers {
    /// The operator tokens' judge.
    pub operators: Arc<dyn Authority>,
    pub node: Arc<dyn ChatNode>,
}

impl Authority for Callers {
    fn check(&self, token: &str) -> Verdict {
        let Some(rest) = token.strip_prefix(SEAT_PREFIX) else {
            return self.operators.check(token);
        };
        let Some((handle, _)) = rest.split_once('.') else {
            return Verdict::Refused(Refused::Unknown);
        };
        let Some(engine) = self.node.engine() else {
            return Verdict::Unknown("the node's engine is not up yet".into());
        };
        let secret = match engine.secrets.get(SECRET) {
            Lookup::Found(s) => s,
            Lookup::Unset => return Verdict::Refused(Refused::Unknown),
            Lookup::Unavailable(why) | Lookup::Unknown(why) => return Verdict::Unknown(why),
        };
        let expected = seat_credential(&secret, handle);
        let same = expected.len() == token.len()
            && expected
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        let seated = engine
            .active
            .current()
            .is_some_and(|a| a.company.seat(handle).is_some());
        if same && seated {
            Verdict::Seat {
                handle: handle.to_owned(),
            }
        } else {
            Verdict::Refused(Refused::Unknown)
        }
    }
}

/// Makes the chat signing secret when the fleet has none, asking again
/// (every 2 s) while the bucket cannot say, until made or `stop`.
pub async fn ensure_secret(secrets: Arc<Secrets>, mut stop: watch::Receiver<bool>) {
    loop {
        match make_secret(&secrets).await {
            Ok(true) => {
                info!(
                    subsystem = "chat",
                    secret = SECRET,
                    "made the chat signing secret"
                );
                return;
            }
            Ok(false) => return,
            Err(e) => {
                warn!(subsystem = "chat", secret = SECRET, error = %e,
                    "the chat signing secret cannot be checked yet; asking again");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// `Ok(true)`: made here; `Ok(false)`: the fleet has one.
async fn make_secret(secrets: &Secrets) -> Result<bool, crewlet_secrets::SecretsError> {
    if !secrets.until_listed().await {
        return Err(crewlet_secrets::SecretsError::Unavailable(
            "the secrets bucket has not been listed".into(),
        ));
    }
    if secrets.record(SECRET).await?.is_some() {
        return Ok(false);
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        crewlet_secrets::SecretsError::Unavailable(format!("no randomness for the secret: {e}"))
    })?;
    secrets.create(SECRET, &hex(&bytes)).await
}

/// The chat routes over the `chat` module and the webhook edge.
pub struct ChatRoutes {
    pub node: Arc<dyn ChatNode>,
    pub tokens: Arc<crewlet_tokens::Tokens>,
}

fn unavailable(why: impl std::fmt::Display) -> ChatRefusal {
    ChatRefusal::Unavailable(why.to_string())
}

impl ChatRoutes {
    fn engine(&self) -> Result<Engine<'_>, ChatRefusal> {
        self.node
            .engine()
            .ok_or_else(|| unavailable("the node's engine is not up yet; retry shortly"))
    }

    fn module(&self) -> Result<Arc<ModulePlugin>, ChatRefusal> {
        self.engine()?
            .module
            .ok_or_else(|| {
                unavailable("this node does not run the `chat` module: start it with --plugins naming plugins/ (plugins/modules/chat)")
            })
    }

    /// One call of the module's `tool` on the node's behalf.
    async fn call(&self, tool: &str, arguments: Value) -> Result<Value, ChatRefusal> {
        let node = ToolCaller {
            seat: String::new(),
            turn_id: String::new(),
        };
        match self.module()?.call_tool(tool, &arguments, &node).await {
            Ok(Ok(text)) => serde_json::from_str(&text)
                .map_err(|e| unavailable(format!("the chat module answered no JSON: {e}"))),
            Ok(Err(ModuleRefusal::Refused(why))) => Err(refused(why)),
            Ok(Err(init @ ModuleRefusal::Init(_))) => Err(unavailable(init)),
            Err(e @ ToolError::BadArguments { .. }) => Err(ChatRefusal::Bad(e.to_string())),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Who posts: the caller's identity (module docs).
    fn author(&self, caller: &Caller) -> Result<String, ChatRefusal> {
        let name = match caller {
            Caller::Seat { handle } => return Ok(handle.clone()),
            Caller::Operator { id, .. } => self.tokens.name_of(id).unwrap_or_default(),
        };
        let name = name.trim().to_ascii_lowercase();
        let usable = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        let author = if usable { name } else { OPERATOR.to_owned() };
        let company = self.engine()?.active.current();
        if company.is_some_and(|a| a.company.seat(&author).is_some()) {
            return Err(ChatRefusal::Forbidden(format!(
                "this token is named {author:?}, a seat's handle: a person never posts as a seat; post with a token named after you (`crewlet tokens create --name NAME`)"
            )));
        }
        Ok(author)
    }

    /// Hands a stored message to this node's webhook edge, signed; `None`
    /// when it was taken, else why not.
    async fn deliver(&self, message: &Value) -> Option<String> {
        let engine = self.node.engine()?;
        let edge = self.node.edge()?;
        let name = engine.active.current().and_then(|a| {
            a.company
                .route_secret(CHAT, None)
                .map(|s| s.name_str().to_owned())
        })?;
        let secret = match engine.secrets.get(&name) {
            Lookup::Found(s) => s,
            Lookup::Unset => return Some(format!("the chat secret {name} is not set")),
            Lookup::Unavailable(why) | Lookup::Unknown(why) => {
                return Some(format!("the chat secret {name} is not known yet: {why}"));
            }
        };
        let body = serde_json::to_vec(message).unwrap_or_default();
        let (timestamp, signature) = crewlet_ingress::sign::chat_headers(secret.as_bytes(), &body);
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-chat-timestamp", timestamp),
            ("x-chat-signature", signature),
            ("content-type", "application/json".to_owned()),
        ] {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        }
        let route = match edge.resolve(CHAT, None) {
            Ok(r) => r,
            Err(refusal) => return Some(refusal.to_string()),
        };
        match edge.serve(&route, &headers, Ok(body.into())).await {
            Outcome::Accepted(_) | Outcome::Duplicate => None,
            other => Some(
                other
                    .reason()
                    .unwrap_or_else(|| format!("{}", other.status())),
            ),
        }
    }
}

/// A module's refusal as the route's answer: its kind is its first word.
fn refused(why: String) -> ChatRefusal {
    if why.starts_with("not-found:") {
        ChatRefusal::NotFound(why)
    } else if why.starts_with("unavailable:") || why.starts_with("bucket-full:") {
        ChatRefusal::Unavailable(why)
    } else {
        ChatRefusal::Bad(why)
    }
}

fn now_ms() -> u64 {
    crewlet_os::now_ms().max(0) as u64
}

impl ChatRoom for ChatRoutes {
    fn channels(&self) -> ChatFuture<'_, Value> {
        Box::pin(self.call("channels", json!({})))
    }

    fn messages(&self, channel: String, query: ReadQuery) -> ChatFuture<'_, Value> {
        let mut args = json!({ "channel": channel });
        for (field, value) in [("thread", query.thread), ("before", query.before)] {
            if let Some(v) = value {
                args[field] = json!(v);
            }
        }
        if let Some(limit) = query.limit {
            args["limit"] = json!(limit);
        }
        Box::pin(self.call("read", args))
    }

    fn post(&self, caller: Caller, channel: String, body: PostBody) -> ChatFuture<'_, Posted> {
        Box::pin(async move {
            if body.text.trim().is_empty() {
                return Err(ChatRefusal::Bad(
                    "`text` is empty: write the message".into(),
                ));
            }
            let author = self.author(&caller)?;
            // A seat may answer a thread that began on another surface.
            let open = matches!(caller, Caller::Seat { .. });
            let mut args = json!({
                "channel": channel, "text": body.text, "author": author, "at_ms": now_ms(),
                "open": open,
            });
            if let Some(t) = body.thread {
                args["thread"] = json!(t);
            }
            if let Some(k) = body.idempotency_key.filter(|k| !k.is_empty()) {
                args["idempotency_key"] = json!(k);
            }
            let answer = self.call("post", args).await?;
            let mut message = answer["message"].clone();
            let duplicate = answer["duplicate"].as_bool().unwrap_or(false);
            // Handed in again on a retry too: its claim makes it once.
            if let Some(why) = self.deliver(&message).await {
                warn!(subsystem = "chat", id = %message["id"], reason = %why,
                    "message stored but not delivered to the inbound edge: nobody is woken by it");
                message["undelivered"] = json!(why);
            }
            Ok(Posted { message, duplicate })
        })
    }

    fn working(&self, channel: String) -> ChatFuture<'_, Value> {
        Box::pin(self.call("working", json!({ "channel": channel })))
    }

    fn indicate(
        &self,
        caller: Caller,
        channel: String,
        body: WorkingBody,
    ) -> ChatFuture<'_, Value> {
        Box::pin(async move {
            let seat = self.author(&caller)?;
            let mut args = json!({
                "channel": channel, "seat": seat, "working": body.working, "at_ms": now_ms(),
            });
            if let Some(t) = body.thread {
                args["thread"] = json!(t);
            }
            self.call("indicate", args).await
        })
    }
}

/// `crewlet chat read`: one line per message, oldest first.
pub fn render(answer: &Value) -> String {
    let mut out = String::new();
    for m in answer["messages"].as_array().into_iter().flatten() {
        let replies = match m["replies"].as_u64() {
            Some(n) if n > 0 => format!("  ({n} replies)"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "{}  {}: {}{replies}\n",
            m["id"].as_str().unwrap_or("?"),
            m["author"].as_str().unwrap_or("?"),
            m["text"].as_str().unwrap_or_default(),
        ));
    }
    if out.is_empty() {
        out.push_str("(no messages)\n");
    }
    out
}

#[cfg(test)]
mod tests;
