//! `chat`: the company chat's channels, threads and messages.
//!
//! Rules, and why:
//! - **One bucket entry per message**, keyed `CHANNEL.THREAD.ID` (a
//!   top-level message is its own thread): one listing of the keys answers
//!   a channel's top-level messages, a thread, and every reply count, with
//!   no index to keep in step (the state interface has no compare-and-set,
//!   and two nodes post at once).
//! - **Ids order by time and are unique fleet-wide** without a shared
//!   counter: `AT_MS-AUTHOR-NONCE`, the milliseconds zero-padded to 13
//!   digits (so the text sorts as the time), the nonce a digest of the post.
//!   Modules read no clock (both WASI clocks read zero): the node passes
//!   `at_ms`.
//! - **A retried post posts once.** A post with an `idempotency_key` looks
//!   for the author's key first (`posted`, a day) and answers the message
//!   it made, with `duplicate: true`. Calls into one module run one at a
//!   time on a node, so a retry on the same node is always caught.
//! - **Any channel, any thread, kept as keys may hold them**: a channel or
//!   thread is encoded as one token of the key (`[A-Za-z0-9_-]` as is, any
//!   other byte `=HH`), so a seat answering a Slack thread (`C0DEMO`,
//!   `1.1`) lands in the chat too. A person replies only in a thread that
//!   exists here; a seat's post (`open`) may name a thread whose start is on
//!   another surface.
//! - **The node posts; seats read.** `post` and `indicate` take the author
//!   from their arguments, so a seat's own turn may not call them (its
//!   posts go through its chat server and the node, which wakes whom it
//!   mentions); `read`, `channels` and `working` serve anyone.
//! - **Stored, then told.** A message is kept whether or not `posted`
//!   reaches the bus; the log says when it did not.

use crewlet_plugin_sdk::module::{
    Event, Guest, StateEvent, ToolCall, describe, info, publish, state,
};
use serde_json::{Value, json};

struct Chat;

const MESSAGES: &str = "messages";
const POSTED: &str = "posted";
const WORKING: &str = "working";
/// A read's messages when it does not say.
const DEFAULT_LIMIT: usize = 50;
/// An answer's JSON is kept under the host's 64 KiB cut, oldest dropped.
const MAX_ANSWER: usize = 60 * 1024;
/// The thread of an indicator raised at a channel's top level.
const TOP: &str = "_";

fn args(call: &ToolCall) -> Result<Value, String> {
    serde_json::from_str(&call.arguments_json).map_err(|e| format!("arguments are not JSON: {e}"))
}

fn text<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    v[field]
        .as_str()
        .ok_or_else(|| format!("`{field}` is required"))
}

/// A name a key may hold as one token: what ids and handles are.
fn token(field: &str, s: &str) -> Result<(), String> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!("`{field}` {s:?} is not a chat name (a-z 0-9 - _)"))
    }
}

/// A channel or thread as one key token (module docs); refused when empty,
/// past 128 bytes or holding a control character.
fn enc(field: &str, s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 || s.chars().any(char::is_control) {
        return Err(format!(
            "`{field}` {s:?} is empty, longer than 128 bytes or holds a control character"
        ));
    }
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    Ok(out)
}

/// [`enc`] undone.
fn dec(token: &str) -> String {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|_| bytes[i] == b'=')
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// FNV-1a, 64 bits: a short stable digest for nonces and keys.
fn digest(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// One key of the messages bucket, split.
struct Key {
    channel: String,
    thread: String,
    id: String,
}

fn split(key: &str) -> Option<Key> {
    let mut parts = key.splitn(3, '.');
    Some(Key {
        channel: parts.next()?.to_owned(),
        thread: parts.next()?.to_owned(),
        id: parts.next()?.to_owned(),
    })
}

fn at_ms_of(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

fn get_json(bucket: &str, key: &str) -> Result<Option<Value>, String> {
    match state::get(bucket, key).map_err(|e| describe(&e))? {
        Some(entry) => serde_json::from_slice(&entry.value)
            .map(Some)
            .map_err(|e| format!("{bucket} {key} is not JSON: {e}")),
        None => Ok(None),
    }
}

fn post(call: &ToolCall) -> Result<String, String> {
    if !call.caller.seat.is_empty() {
        return Err("a seat posts through its chat server (post_message), not this tool".into());
    }
    let a = args(call)?;
    let channel = text(&a, "channel")?;
    let body = text(&a, "text")?;
    let author = text(&a, "author")?;
    let at_ms = a["at_ms"].as_u64().ok_or("`at_ms` is required")?;
    let ch = enc("channel", channel)?;
    token("author", author)?;
    let remembered = match a["idempotency_key"].as_str() {
        Some(k) => {
            let key = format!("{ch}.{author}.{}", digest(&[k]));
            if let Some(entry) = state::get(POSTED, &key).map_err(|e| describe(&e))? {
                let kept = String::from_utf8_lossy(&entry.value).into_owned();
                if let Some(message) = get_json(MESSAGES, &kept)? {
                    return Ok(json!({ "message": message, "duplicate": true }).to_string());
                }
            }
            Some(key)
        }
        None => None,
    };
    let thread = match a["thread"].as_str() {
        Some(t) => {
            let th = enc("thread", t)?;
            let open = a["open"].as_bool().unwrap_or(false);
            if !open
                && state::get(MESSAGES, &format!("{ch}.{th}.{th}"))
                    .map_err(|e| describe(&e))?
                    .is_none()
            {
                return Err(format!(
                    "not-found: #{channel} has no thread {t}; reply to a top-level message's id"
                ));
            }
            Some((t.to_owned(), th))
        }
        None => None,
    };
    let nonce = digest(&[
        channel,
        author,
        body,
        &at_ms.to_string(),
        a["idempotency_key"].as_str().unwrap_or(""),
    ]);
    let id = format!("{at_ms:013}-{author}-{}", &nonce[..8]);
    let root = thread
        .as_ref()
        .map_or_else(|| id.clone(), |(_, th)| th.clone());
    let message = json!({
        "id": id,
        "channel": channel,
        "thread": thread.map(|(t, _)| t),
        "author": author,
        "text": body,
        "at_ms": at_ms,
    });
    let key = format!("{ch}.{root}.{id}");
    state::put(MESSAGES, &key, message.to_string().as_bytes()).map_err(|e| describe(&e))?;
    if let Some(remembered) = remembered {
        // The message stands; a key not kept means a retry may post again.
        if let Err(e) = state::put(POSTED, &remembered, key.as_bytes()) {
            info(&format!(
                "message {id} posted; its idempotency key not kept: {}",
                describe(&e)
            ));
        }
    }
    if let Err(e) = publish("posted", &message) {
        info(&format!("message {id} posted; `posted` not published: {e}"));
    }
    Ok(json!({ "message": message, "duplicate": false }).to_string())
}

/// The keys of encoded channel `ch`, split, oldest first.
fn channel_keys(ch: &str) -> Result<Vec<Key>, String> {
    let prefix = format!("{ch}.");
    let mut keys: Vec<Key> = state::keys(MESSAGES)
        .map_err(|e| describe(&e))?
        .iter()
        .filter(|k| k.starts_with(&prefix))
        .filter_map(|k| split(k))
        .collect();
    keys.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(keys)
}

fn read(call: &ToolCall) -> Result<String, String> {
    let a = args(call)?;
    let channel = text(&a, "channel")?;
    let ch = enc("channel", channel)?;
    let limit = a["limit"].as_u64().map_or(DEFAULT_LIMIT, |l| l as usize);
    let before = a["before"].as_str();
    let keys = channel_keys(&ch)?;
    let thread = match a["thread"].as_str() {
        Some(t) => Some((t, enc("thread", t)?)),
        None => None,
    };
    if let Some((t, th)) = &thread
        && !keys.iter().any(|k| &k.thread == th)
    {
        return Err(format!("not-found: #{channel} has no thread {t}"));
    }
    let chosen: Vec<&Key> = keys
        .iter()
        .filter(|k| match &thread {
            Some((_, th)) => &k.thread == th,
            None => k.thread == k.id,
        })
        .filter(|k| before.is_none_or(|b| k.id.as_str() < b))
        .collect();
    let page = &chosen[chosen.len().saturating_sub(limit)..];
    let mut messages = Vec::new();
    for k in page {
        let key = format!("{}.{}.{}", k.channel, k.thread, k.id);
        let Some(mut m) = get_json(MESSAGES, &key)? else {
            continue;
        };
        if thread.is_none() {
            let replies = keys
                .iter()
                .filter(|r| r.thread == k.id && r.id != k.id)
                .count();
            m["replies"] = json!(replies);
        }
        messages.push(m);
    }
    let mut answer = json!({ "messages": messages });
    while answer.to_string().len() > MAX_ANSWER {
        let list = answer["messages"].as_array_mut().ok_or("no messages")?;
        if list.is_empty() {
            break;
        }
        list.remove(0);
        answer["truncated"] = json!(true);
    }
    Ok(answer.to_string())
}

fn channels() -> Result<String, String> {
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for key in state::keys(MESSAGES).map_err(|e| describe(&e))? {
        let Some(k) = split(&key) else { continue };
        let at = at_ms_of(&k.id);
        match out.iter_mut().find(|(name, _, _)| *name == k.channel) {
            Some((_, n, last)) => {
                *n += 1;
                *last = (*last).max(at);
            }
            None => out.push((k.channel, 1, at)),
        }
    }
    out.sort();
    let channels: Vec<Value> = out
        .into_iter()
        .map(|(name, messages, last_at_ms)| {
            json!({ "name": dec(&name), "messages": messages, "last_at_ms": last_at_ms })
        })
        .collect();
    Ok(json!({ "channels": channels }).to_string())
}

fn working(call: &ToolCall) -> Result<String, String> {
    let a = args(call)?;
    let channel = text(&a, "channel")?;
    let prefix = format!("{}.", enc("channel", channel)?);
    let mut rows = Vec::new();
    for key in state::keys(WORKING).map_err(|e| describe(&e))? {
        if !key.starts_with(&prefix) {
            continue;
        }
        if let Some(row) = get_json(WORKING, &key)? {
            rows.push(json!({ "seat": row["seat"], "thread": row["thread"], "since_ms": row["since_ms"] }));
        }
    }
    Ok(json!({ "working": rows }).to_string())
}

fn indicate(call: &ToolCall) -> Result<String, String> {
    if !call.caller.seat.is_empty() {
        return Err("a seat shows it is working through its chat server, not this tool".into());
    }
    let a = args(call)?;
    let channel = text(&a, "channel")?;
    let seat = text(&a, "seat")?;
    let ch = enc("channel", channel)?;
    token("seat", seat)?;
    let thread = a["thread"].as_str();
    let th = match thread {
        Some(t) => enc("thread", t)?,
        None => TOP.to_owned(),
    };
    let on = a["working"].as_bool().ok_or("`working` is required")?;
    let key = format!("{ch}.{th}.{seat}");
    if on {
        let row = json!({ "seat": seat, "thread": thread, "since_ms": a["at_ms"] });
        state::put(WORKING, &key, row.to_string().as_bytes()).map_err(|e| describe(&e))?;
    } else {
        state::delete(WORKING, &key).map_err(|e| describe(&e))?;
    }
    let change = json!({ "channel": channel, "thread": thread, "seat": seat, "working": on });
    if let Err(e) = publish("working", &change) {
        info(&format!(
            "{seat}'s indicator in #{channel} set; `working` not published: {e}"
        ));
    }
    Ok(change.to_string())
}

impl Guest for Chat {
    fn init() -> Result<(), String> {
        info("chat ready: owns buckets `messages`, `posted` and `working`");
        Ok(())
    }

    fn on_event(event: Event) -> Result<(), String> {
        Err(format!(
            "chat subscribes to nothing, yet was sent `{}`",
            event.topic
        ))
    }

    fn on_state(_event: StateEvent) -> Result<(), String> {
        Err("chat starts no watch".to_string())
    }

    fn call_tool(call: ToolCall) -> Result<String, String> {
        match call.name.as_str() {
            "post" => post(&call),
            "read" => read(&call),
            "channels" => channels(),
            "working" => working(&call),
            "indicate" => indicate(&call),
            other => Err(format!("chat has no tool `{other}`")),
        }
    }
}

crewlet_plugin_sdk::module::export_module!(Chat);
