//! The company-chat mode of `crewlet mcp chat` (`docs/chat.md`): the same
//! tools over the node's chat routes, posting as the seat the credential
//! was minted for.
//!
//! Rule: the credential is the identity. `CHAT_TOKEN` goes in every
//! request's `Authorization`; the node takes the author from it, so this
//! child cannot post as anyone else whatever a model asks, and `whoami`
//! answers the handle the credential names.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Message, Posted, Thread, Where};

/// The variable naming the node's API (company-chat mode).
pub const URL_ENV: &str = "CHAT_URL";
/// The variable holding the seat's chat credential (company-chat mode).
pub const TOKEN_ENV: &str = "CHAT_TOKEN";
/// The newest messages a thread read asks for.
const READ_LIMIT: u32 = 50;
/// How long one call to the node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A call to the node's chat that did not do what was asked; the text is
/// the tool's answer to the seat, saying whose side failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChatCallError {
    /// The node did not answer (down, or the URL is wrong): try again later.
    #[error("the chat at {url} did not answer: {why}")]
    Unreachable { url: String, why: String },
    /// The answer stopped half-way: the call may have been done; read back.
    #[error("the chat's answer was cut off: {0}")]
    CutOff(String),
    /// The node refused the call; `detail` is its reason.
    #[error("the chat refused the call ({status}): {detail}")]
    Refused {
        status: reqwest::StatusCode,
        detail: String,
    },
}

/// The node's chat, reached over HTTP with one seat's credential.
#[derive(Debug, Clone)]
pub struct CompanyChat {
    url: Arc<str>,
    token: Arc<str>,
    http: reqwest::Client,
}

/// A path segment, percent-encoded past the unreserved characters.
pub fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

impl CompanyChat {
    pub fn new(url: &str, token: &str) -> CompanyChat {
        CompanyChat {
            url: url.trim_end_matches('/').into(),
            token: token.into(),
            http: reqwest::Client::new(),
        }
    }

    /// The handle a seat's credential (`crewlet-chat.HANDLE.MAC`) names.
    pub fn identity(&self) -> Option<String> {
        let rest = self.token.strip_prefix("crewlet-chat.")?;
        rest.split_once('.').map(|(handle, _)| handle.to_owned())
    }

    /// One request; a transport failure is `Err`, any answer is `Ok`.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(reqwest::StatusCode, Value), ChatCallError> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&*self.token)
            .timeout(CALL_TIMEOUT);
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        let resp = req.send().await.map_err(|e| ChatCallError::Unreachable {
            url: self.url.to_string(),
            why: e.to_string(),
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ChatCallError::CutOff(e.to_string()))?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// One request whose answer must be a success.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ChatCallError> {
        let (status, value) = self.send(method, path, body).await?;
        refused_unless_ok(status, value)
    }

    pub async fn post(
        &self,
        channel: &str,
        thread: Option<&str>,
        text: &str,
        key: Option<&str>,
    ) -> Result<Posted, ChatCallError> {
        let mut body = json!({ "text": text });
        if let Some(t) = thread {
            body["thread"] = json!(t);
        }
        if let Some(k) = key {
            body["idempotency_key"] = json!(k);
        }
        let path = format!("/chat/channels/{}/messages", segment(channel));
        let m = self.call(reqwest::Method::POST, &path, Some(body)).await?;
        Ok(Posted {
            posted: true,
            id: m["id"].as_str().unwrap_or_default().to_owned(),
            duplicate: m["duplicate"].as_bool().unwrap_or(false),
        })
    }

    pub async fn read(&self, channel: &str, thread: Option<&str>) -> Result<Thread, ChatCallError> {
        let mut path = format!(
            "/chat/channels/{}/messages?limit={READ_LIMIT}",
            segment(channel)
        );
        if let Some(t) = thread {
            path.push_str(&format!("&thread={}", segment(t)));
        }
        // A thread with nothing here yet (begun on another surface) reads
        // as empty: there is nothing to read back, which is no failure.
        let (status, answer) = self.send(reqwest::Method::GET, &path, None).await?;
        if status == reqwest::StatusCode::NOT_FOUND && thread.is_some() {
            return Ok(Thread {
                messages: Vec::new(),
            });
        }
        let answer = refused_unless_ok(status, answer)?;
        let messages = answer["messages"]
            .as_array()
            .map(|list| {
                list.iter()
                    .map(|m| Message {
                        author: m["author"].as_str().unwrap_or_default().to_owned(),
                        channel: m["channel"].as_str().unwrap_or(channel).to_owned(),
                        thread: m["thread"].as_str().map(str::to_owned),
                        text: m["text"].as_str().unwrap_or_default().to_owned(),
                        at_ms: m["at_ms"].as_u64().unwrap_or_default(),
                        idempotency_key: None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Thread { messages })
    }

    pub async fn indicate(&self, at: Where, working: bool) -> Result<String, ChatCallError> {
        let path = format!("/chat/channels/{}/working", segment(&at.channel));
        let body = json!({ "thread": at.thread, "working": working });
        self.call(reqwest::Method::PUT, &path, Some(body)).await?;
        Ok(if working { "raised" } else { "cleared" }.to_owned())
    }
}

/// `value` when `status` is a success, else the node's reason.
fn refused_unless_ok(status: reqwest::StatusCode, value: Value) -> Result<Value, ChatCallError> {
    if status.is_success() {
        return Ok(value);
    }
    let detail = value["detail"]
        .as_str()
        .or(value["error"].as_str())
        .unwrap_or("no reason given")
        .to_owned();
    Err(ChatCallError::Refused { status, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_names_its_seat_and_segments_are_encoded() {
        let chat = CompanyChat::new("http://127.0.0.1:1/", "crewlet-chat.grace.00ff");
        assert_eq!(chat.identity().as_deref(), Some("grace"));
        assert_eq!(CompanyChat::new("http://x", "op-token").identity(), None);
        assert_eq!(segment("eng/ops x"), "eng%2Fops%20x");
    }
}
