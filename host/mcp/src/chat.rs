//! A small real chat MCP server over stdio, for the tests and the example
//! company: the seat it runs for posts and reads threads as itself.
//!
//! Its identity is the credential it was started with (env `CHAT_IDENTITY`):
//! exactly what a per-seat child of a real chat backend would carry. Messages
//! are JSON lines in the file named by env `CHAT_LOG`, shared by every child
//! on the machine; each post is one `write` under an exclusive `flock`, so
//! concurrent children neither interleave nor hand out one id twice (a
//! message's id is its line number in the log).
//!
//! While a seat thinks, its turn raises the working indicator in the thread
//! (`raise_working`) and clears it when the turn ends (`clear_working`);
//! each change is one JSON line in the working log beside the message log
//! ([`working_log`]: `chat.jsonl` → `chat.working.jsonl`), so the message
//! log holds messages only.
//!
//! A post may carry an `idempotency_key`: a second post by the same author
//! with the same key posts nothing and answers the first one's id with
//! `duplicate: true` — what lets a node that crashed mid-post post the
//! owed reply again without posting it twice.
//!
//! With `CHAT_URL` set the same tools talk to the company chat of a node
//! instead ([`company`]: `CHAT_TOKEN` is the seat's credential, and the
//! identity), and no file is written.

pub mod company;

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;

use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::{ServerHandler, ServiceExt, tool, tool_handler, tool_router};
use serde::{Deserialize, Serialize};

/// The variable holding the identity (the seat's chat credential).
pub const IDENTITY_ENV: &str = "CHAT_IDENTITY";
/// The variable naming the message log file.
pub const LOG_ENV: &str = "CHAT_LOG";

/// Why the chat server cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error(
        "{} is set but {} is not: start this server with the seat's chat credential (`${{CREWLET_CHAT_TOKEN}}`) in {}",
        company::URL_ENV,
        company::TOKEN_ENV,
        company::TOKEN_ENV
    )]
    NoToken,
    #[error(
        "{IDENTITY_ENV} is not set: start this server with the seat's chat credential in {IDENTITY_ENV}"
    )]
    NoIdentity,
    #[error("{LOG_ENV} is not set: name the message log file in {LOG_ENV}")]
    NoLog,
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// One message as stored (one JSON line in the log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Message {
    /// Who posted it.
    #[serde(rename = "as")]
    pub author: String,
    pub channel: String,
    pub thread: Option<String>,
    pub text: String,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The poster's idempotency key, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PostMessage {
    /// The channel to post in, e.g. `eng`.
    pub channel: String,
    /// The thread to reply in; leave out to post at the channel's top level.
    #[serde(default)]
    pub thread: Option<String>,
    /// The message text.
    pub text: String,
    /// Give the same key to post again safely: a post whose key you already
    /// used posts nothing and answers the first post's id.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReadThread {
    /// The channel to read.
    pub channel: String,
    /// The thread to read; leave out for the channel's top-level messages.
    #[serde(default)]
    pub thread: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct Where {
    /// The channel the work is about.
    pub channel: String,
    /// The thread, if the work is in one.
    #[serde(default)]
    pub thread: Option<String>,
}

/// One change of the working indicator (one JSON line in the working log).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Working {
    /// Whose indicator.
    #[serde(rename = "as")]
    pub author: String,
    pub channel: String,
    pub thread: Option<String>,
    /// Raised (`true`) or cleared.
    pub working: bool,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Posted {
    pub posted: bool,
    /// The message's id (its number in the log).
    pub id: String,
    /// The idempotency key was used before: nothing new was posted.
    pub duplicate: bool,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Thread {
    /// Oldest first.
    pub messages: Vec<Message>,
}

/// Where the messages live: a local file, or a node's company chat.
#[derive(Debug, Clone)]
enum Backend {
    File(Arc<PathBuf>),
    Company(company::CompanyChat),
}

/// The server: one identity, one place its messages go.
#[derive(Debug, Clone)]
pub struct ChatServer {
    identity: Arc<str>,
    backend: Backend,
}

#[tool_router]
impl ChatServer {
    pub fn new(identity: impl Into<Arc<str>>, log: impl Into<PathBuf>) -> ChatServer {
        ChatServer {
            identity: identity.into(),
            backend: Backend::File(Arc::new(log.into())),
        }
    }

    /// A server over a node's company chat, posting as `chat`'s credential.
    pub fn company(identity: impl Into<Arc<str>>, chat: company::CompanyChat) -> ChatServer {
        ChatServer {
            identity: identity.into(),
            backend: Backend::Company(chat),
        }
    }

    #[tool(
        description = "Post a message to a chat channel, as you (see whoami). Give `thread` to reply inside a thread; leave it out to start a top-level message. Answers the new message's id."
    )]
    async fn post_message(
        &self,
        Parameters(post): Parameters<PostMessage>,
    ) -> Result<Json<Posted>, String> {
        if post.channel.trim().is_empty() {
            return Err("`channel` is empty: name the channel to post in".to_owned());
        }
        if post.text.trim().is_empty() {
            return Err("`text` is empty: write the message to post".to_owned());
        }
        let log = match &self.backend {
            Backend::File(log) => log.clone(),
            Backend::Company(chat) => {
                let key = post.idempotency_key.as_deref().filter(|k| !k.is_empty());
                return chat
                    .post(&post.channel, post.thread.as_deref(), &post.text, key)
                    .await
                    .map(Json)
                    .map_err(|e| e.to_string());
            }
        };
        let message = Message {
            author: self.identity.to_string(),
            channel: post.channel,
            thread: post.thread,
            text: post.text,
            at_ms: crewlet_os::now_ms() as u64,
            idempotency_key: post.idempotency_key.filter(|k| !k.is_empty()),
        };
        let (id, duplicate) = tokio::task::spawn_blocking(move || append(&log, &message))
            .await
            .map_err(|e| format!("the post was interrupted: {e}"))?
            .map_err(|e| format!("could not write the chat log: {e}"))?;
        Ok(Json(Posted {
            posted: true,
            id: id.to_string(),
            duplicate,
        }))
    }

    #[tool(
        description = "Read the messages of one chat thread, oldest first. Give `thread` for a thread's replies; leave it out for the channel's top-level messages."
    )]
    async fn read_thread(
        &self,
        Parameters(read): Parameters<ReadThread>,
    ) -> Result<Json<Thread>, String> {
        let log = match &self.backend {
            Backend::File(log) => log.clone(),
            Backend::Company(chat) => {
                return chat
                    .read(&read.channel, read.thread.as_deref())
                    .await
                    .map(Json)
                    .map_err(|e| e.to_string());
            }
        };
        let all = tokio::task::spawn_blocking(move || read_all(&log))
            .await
            .map_err(|e| format!("the read was interrupted: {e}"))?
            .map_err(|e| format!("could not read the chat log: {e}"))?;
        let messages = all
            .into_iter()
            .filter(|m| m.channel == read.channel && m.thread == read.thread)
            .collect();
        Ok(Json(Thread { messages }))
    }

    #[tool(
        description = "Show that you are working on something in a channel or thread (people see you typing) until clear_working."
    )]
    async fn raise_working(&self, Parameters(at): Parameters<Where>) -> Result<String, String> {
        self.indicate(at, true).await
    }

    #[tool(description = "Stop showing that you are working in a channel or thread.")]
    async fn clear_working(&self, Parameters(at): Parameters<Where>) -> Result<String, String> {
        self.indicate(at, false).await
    }

    async fn indicate(&self, at: Where, working: bool) -> Result<String, String> {
        if at.channel.trim().is_empty() {
            return Err("`channel` is empty: name the channel you work in".to_owned());
        }
        let log = match &self.backend {
            Backend::File(log) => working_log(log),
            Backend::Company(chat) => {
                return chat.indicate(at, working).await.map_err(|e| e.to_string());
            }
        };
        let change = Working {
            author: self.identity.to_string(),
            channel: at.channel,
            thread: at.thread,
            working,
            at_ms: crewlet_os::now_ms() as u64,
        };
        tokio::task::spawn_blocking(move || append_line(&log, &change))
            .await
            .map_err(|e| format!("the change was interrupted: {e}"))?
            .map_err(|e| format!("could not write the working log: {e}"))?;
        Ok(if working { "raised" } else { "cleared" }.to_owned())
    }

    #[tool(description = "Answer who you are in this chat: the name your posts appear under.")]
    async fn whoami(&self) -> String {
        self.identity.to_string()
    }
}

#[tool_handler(
    name = "crewlet-chat",
    instructions = "A team chat. Post with post_message, read a thread with read_thread, show you are working with raise_working / clear_working, and ask whoami for the name you post as."
)]
impl ServerHandler for ChatServer {}

/// Serves one MCP session on stdin/stdout until the client closes it.
/// With `CHAT_URL`: the company chat, as `CHAT_TOKEN`'s seat; else the file
/// `CHAT_LOG`, as `CHAT_IDENTITY`. Refuses to start without them.
pub async fn serve_stdio() -> Result<(), ChatError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let server = match var(company::URL_ENV) {
        Some(url) => {
            let token = var(company::TOKEN_ENV).ok_or(ChatError::NoToken)?;
            let chat = company::CompanyChat::new(&url, &token);
            let identity = chat
                .identity()
                .or_else(|| var(IDENTITY_ENV))
                .ok_or(ChatError::NoIdentity)?;
            ChatServer::company(identity, chat)
        }
        None => {
            let identity = var(IDENTITY_ENV).ok_or(ChatError::NoIdentity)?;
            let log = std::env::var_os(LOG_ENV)
                .filter(|v| !v.is_empty())
                .ok_or(ChatError::NoLog)?;
            ChatServer::new(identity, log)
        }
    };
    let session = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| ChatError::Session(e.to_string()))?;
    session
        .waiting()
        .await
        .map_err(|e| ChatError::Session(e.to_string()))?;
    Ok(())
}

/// Appends `message` as one line with one write, under an exclusive lock;
/// answers its line number (1-based). A message whose author already posted
/// with its idempotency key is not appended: the earlier line's number is
/// answered, with `true`.
fn append(log: &std::path::Path, message: &Message) -> std::io::Result<(u64, bool)> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(log)?;
    let _lock = Flock::exclusive(&file)?;
    (&file).seek(SeekFrom::Start(0))?;
    let mut before = Vec::new();
    (&file).read_to_end(&mut before)?;
    if let Some(key) = &message.idempotency_key {
        let earlier = before.split(|b| *b == b'\n').position(|l| {
            serde_json::from_slice::<Message>(l).is_ok_and(|m| {
                m.author == message.author && m.idempotency_key.as_ref() == Some(key)
            })
        });
        if let Some(i) = earlier {
            return Ok((i as u64 + 1, true));
        }
    }
    let id = before.iter().filter(|b| **b == b'\n').count() as u64 + 1;
    (&file).write_all(&line)?;
    Ok((id, false))
}

/// The working log beside the message log `log`: `chat.jsonl` →
/// `chat.working.jsonl`.
pub fn working_log(log: &std::path::Path) -> PathBuf {
    log.with_extension("working.jsonl")
}

/// Appends `value` as one JSON line with one write, under an exclusive lock.
fn append_line(log: &std::path::Path, value: &impl Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let file = OpenOptions::new().create(true).append(true).open(log)?;
    let _lock = Flock::exclusive(&file)?;
    (&file).write_all(&line)
}

fn read_all(log: &std::path::Path) -> std::io::Result<Vec<Message>> {
    let file = match File::open(log) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let _lock = Flock::shared(&file)?;
    let mut text = String::new();
    (&file).read_to_string(&mut text)?;
    // A line another program wrote badly is skipped, not fatal.
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// An `flock` held until dropped.
struct Flock<'f>(&'f File);

impl<'f> Flock<'f> {
    fn exclusive(file: &'f File) -> std::io::Result<Flock<'f>> {
        Self::take(file, libc::LOCK_EX)
    }

    fn shared(file: &'f File) -> std::io::Result<Flock<'f>> {
        Self::take(file, libc::LOCK_SH)
    }

    fn take(file: &'f File, how: libc::c_int) -> std::io::Result<Flock<'f>> {
        // SAFETY: flock on a descriptor this File owns.
        if unsafe { libc::flock(file.as_raw_fd(), how) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Flock(file))
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: as above; unlocking cannot fail in a way we could act on.
        unsafe {
            libc::flock(self.0.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str, thread: Option<&str>) -> Message {
        Message {
            author: "ana".into(),
            channel: "eng".into(),
            thread: thread.map(str::to_owned),
            text: text.into(),
            at_ms: 1,
            idempotency_key: None,
        }
    }

    #[test]
    fn appends_number_lines_and_reads_skip_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("chat.jsonl");
        assert!(
            read_all(&log).unwrap().is_empty(),
            "a missing log reads empty"
        );
        assert_eq!(append(&log, &message("one", None)).unwrap(), (1, false));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(b"not json\n")
            .unwrap();
        assert_eq!(
            append(&log, &message("two", Some("t1"))).unwrap(),
            (3, false)
        );
        let all = read_all(&log).unwrap();
        assert_eq!(all, vec![message("one", None), message("two", Some("t1"))]);
        let line = std::fs::read_to_string(&log).unwrap();
        assert!(
            line.starts_with(r#"{"as":"ana","channel":"eng","thread":null"#),
            "{line}"
        );
    }

    #[test]
    fn a_key_used_before_by_the_same_author_posts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("chat.jsonl");
        let keyed = |author: &str, text: &str, key: &str| Message {
            author: author.into(),
            idempotency_key: Some(key.into()),
            ..message(text, Some("t1"))
        };
        assert_eq!(append(&log, &keyed("ana", "hi", "k1")).unwrap(), (1, false));
        assert_eq!(append(&log, &message("other", None)).unwrap(), (2, false));
        assert_eq!(
            append(&log, &keyed("ana", "hi, again", "k1")).unwrap(),
            (1, true),
            "the same key answers the first post"
        );
        assert_eq!(
            append(&log, &keyed("bob", "hi", "k1")).unwrap(),
            (3, false),
            "a key is the author's own"
        );
        assert_eq!(read_all(&log).unwrap().len(), 3);
    }
}
