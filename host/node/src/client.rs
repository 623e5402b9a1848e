//! The command line's client for a running node's API: plain HTTP/1.1 over
//! one TCP connection (the API is reached on loopback or a private network;
//! no TLS, no redirects, no connection reuse). Every request carries the
//! operator token [`crate::tokens::cli_token`] finds, unless the caller
//! sends its own `Authorization`.

use std::io::{Read, Write};
use std::time::Duration;

/// The API a command talks to when none is given.
pub const DEFAULT_API: &str = "http://127.0.0.1:7420";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "--api {0}: not a plain http://HOST:PORT address; pass the node's HTTP listener, e.g. {DEFAULT_API}"
    )]
    BadApi(String),
    #[error("cannot reach the node at {api}: {source}; is `crewlet run` up and listening there?")]
    Unreachable {
        api: String,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    /// For a command that can also write into a stopped node's store: the
    /// way out when no node answers.
    pub fn offline_hint(&self) -> &'static str {
        match self {
            ClientError::Unreachable { .. } => {
                "; or pass --data-dir to write into a stopped node's store"
            }
            ClientError::BadApi(_) => "",
        }
    }
}

/// One request; answers (status, body).
pub fn request(
    api: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), ClientError> {
    let rest = api
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::BadApi(api.to_owned()))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() {
        return Err(ClientError::BadApi(api.to_owned()));
    }
    let addr = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let unreachable = |source| ClientError::Unreachable {
        api: api.to_owned(),
        source,
    };
    let mut stream = std::net::TcpStream::connect(&addr).map_err(unreachable)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(unreachable)?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        head.push_str("Content-Type: application/octet-stream\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        && let Some(token) = crate::tokens::cli_token()
    {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(unreachable)?;
    stream.write_all(body).map_err(unreachable)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(unreachable)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            unreachable(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the answer has no HTTP status line",
            ))
        })?;
    Ok((status, body.to_owned()))
}

/// A read over the API (`crewlet budgets show`, `agents`, `fleet`),
/// printed by `render` or as JSON; answers the exit status.
pub fn shown(api: &str, path: &str, json: bool, render: fn(&serde_json::Value) -> String) -> i32 {
    match request(api, "GET", path, &[], b"") {
        Ok((200, body)) => match serde_json::from_str::<serde_json::Value>(&body) {
            Ok(v) if json => {
                println!("{v:#}");
                0
            }
            Ok(v) => {
                print!("{}", render(&v));
                0
            }
            Err(e) => {
                eprintln!("crewlet: the node's answer is not JSON: {e}");
                1
            }
        },
        Ok((status, body)) => {
            eprintln!("crewlet: the node answered {status}: {}", body.trim());
            1
        }
        Err(e) => {
            eprintln!("crewlet: {e}");
            1
        }
    }
}
