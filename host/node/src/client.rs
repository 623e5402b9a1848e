//! The command line's client for a running node's API: plain HTTP/1.1 over
//! one TCP connection (the API is reached on loopback or a private network;
//! no TLS, no redirects, no connection reuse). Every request carries the
//! operator token [`Credential::find`] finds, unless the caller sends its
//! own `Authorization`.
//!
//! Rule: a command talks to the node it is pointed at. A node keeps its
//! first-start token in its own data dir, so the token is looked up in the
//! data dir the command names (`--data-dir`, `CREWLET_DATA_DIR`), never
//! silently in another; and when the node refuses what was sent, the error
//! says which token was sent, from where, and the flag or variable that
//! sends the right one (naming the node's data dir, which its `/health`
//! tells). Why: `run --data-dir X` and a bare `crewlet agents` once met as
//! a plain 401, "not one this fleet issued", with no way out in sight.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crewlet_tokens::{TOKEN_ENV, TOKEN_FILE};

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
    /// The node refused the operator credential this command sent.
    #[error("the node at {api} refused {sent}: {said}; {fix}")]
    Unauthorized {
        api: String,
        /// What was sent, and from where.
        sent: String,
        /// The node's own reason.
        said: String,
        /// The flag or variable that sends the right token.
        fix: String,
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
            ClientError::BadApi(_) | ClientError::Unauthorized { .. } => "",
        }
    }
}

/// A running node as a command addresses it: its API, and the data dir
/// whose first-start token to send (`None`: `CREWLET_DATA_DIR`, else the
/// default data dir).
#[derive(Debug, Clone, Copy)]
pub struct NodeApi<'a> {
    pub api: &'a str,
    pub data_dir: Option<&'a Path>,
}

/// Where the operator token a command sends comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `CREWLET_TOKEN`.
    Env,
    /// A node's first-start token file.
    File(PathBuf),
    /// No token: `CREWLET_TOKEN` unset and no token file here.
    Missing(PathBuf),
}

/// The operator token a command sends, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub token: Option<String>,
    pub source: TokenSource,
}

impl Credential {
    /// `CREWLET_TOKEN`, else the first-start token in `data_dir` (else in
    /// `CREWLET_DATA_DIR`, else in the default data dir).
    pub fn find(data_dir: Option<&Path>) -> Credential {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        Credential::lookup(
            var(TOKEN_ENV).and_then(|v| v.into_string().ok()),
            data_dir
                .map(Path::to_path_buf)
                .or_else(|| var("CREWLET_DATA_DIR").map(PathBuf::from)),
        )
    }

    fn lookup(env: Option<String>, data_dir: Option<PathBuf>) -> Credential {
        if let Some(t) = env.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()) {
            return Credential {
                token: Some(t),
                source: TokenSource::Env,
            };
        }
        let file = data_dir
            .unwrap_or_else(|| PathBuf::from(crewlet_config::DEFAULT_DATA_DIR))
            .join(TOKEN_FILE);
        match std::fs::read_to_string(&file)
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
        {
            Some(t) => Credential {
                token: Some(t),
                source: TokenSource::File(file),
            },
            None => Credential {
                token: None,
                source: TokenSource::Missing(file),
            },
        }
    }

    /// What was sent, for an error.
    fn sent(&self) -> String {
        match &self.source {
            TokenSource::Env => format!("the token in {TOKEN_ENV}"),
            TokenSource::File(f) => format!("the first-start token in {}", f.display()),
            TokenSource::Missing(f) => format!(
                "the request for want of a token ({TOKEN_ENV} is unset and {} does not exist)",
                f.display()
            ),
        }
    }
}

/// One request to the node at `api`, with the token of the data dir
/// `CREWLET_DATA_DIR` names (else the default); answers (status, body).
pub fn request(
    api: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), ClientError> {
    request_to(
        NodeApi {
            api,
            data_dir: None,
        },
        method,
        path,
        headers,
        body,
    )
}

/// One request to `node`; answers (status, body). A refused operator
/// credential (401 off the webhook routes, which answer their senders'
/// signatures) is [`ClientError::Unauthorized`], saying what to do.
pub fn request_to(
    node: NodeApi<'_>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String), ClientError> {
    let own = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
    let credential = (!own).then(|| Credential::find(node.data_dir));
    let bearer = credential
        .as_ref()
        .and_then(|c| c.token.as_ref())
        .map(|t| format!("Bearer {t}"));
    let mut all: Vec<(&str, &str)> = headers.to_vec();
    if let Some(b) = &bearer {
        all.push(("Authorization", b));
    }
    let (status, answer) = exchange(node.api, method, path, &all, body, ANSWER_WITHIN)?;
    match credential {
        Some(c) if status == 401 && !path.starts_with("/webhooks/") => {
            Err(unauthorized(node.api, &c, &answer))
        }
        _ => Ok((status, answer)),
    }
}

/// The error for a refused credential: the node's reason, and the way to
/// the right token (the node's data dir, as its `/health` tells).
fn unauthorized(api: &str, sent: &Credential, answer: &str) -> ClientError {
    let refusal: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
    let said = refusal["error"]
        .as_str()
        .map(|e| e.split(';').next().unwrap_or(e).trim().to_owned())
        .unwrap_or_else(|| answer.trim().to_owned());
    let scope = refusal["scope_needed"].as_str().unwrap_or("read");
    let node_dir =
        health(api, Duration::from_secs(5)).and_then(|h| h["data_dir"].as_str().map(PathBuf::from));
    ClientError::Unauthorized {
        api: api.to_owned(),
        sent: sent.sent(),
        said,
        fix: fix(&sent.source, node_dir.as_deref(), scope),
    }
}

/// The flag or variable that sends the token the node would take.
fn fix(source: &TokenSource, node_dir: Option<&Path>, scope: &str) -> String {
    let other = format!(
        "or set {TOKEN_ENV} to a token of scope {scope} or above (`crewlet tokens create`)"
    );
    let same = |f: &Path| {
        node_dir.is_some_and(|d| {
            let file = d.join(TOKEN_FILE);
            file == f || matches!((file.canonicalize(), f.canonicalize()), (Ok(a), Ok(b)) if a == b)
        })
    };
    match (source, node_dir) {
        (TokenSource::File(f), Some(_)) if same(f) => format!(
            "that file is this node's, but its token is no longer live (revoked, or the fleet's first-start token was made by another node); {other}"
        ),
        (TokenSource::Env, _) => format!(
            "unset {TOKEN_ENV} to send the first-start token of the node's data dir instead, {other}"
        ),
        (_, Some(d)) => format!(
            "this node runs with --data-dir {dir} and keeps its first-start token in {file}: pass --data-dir {dir} (or set CREWLET_DATA_DIR={dir}), {other}",
            dir = d.display(),
            file = d.join(TOKEN_FILE).display()
        ),
        (_, None) => format!(
            "pass --data-dir DIR (or set CREWLET_DATA_DIR=DIR) naming the --data-dir the node runs with, whose first-start token is DIR/{TOKEN_FILE}, {other}"
        ),
    }
}

/// How long a command waits for a node to connect, and then to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// The node's `/health` (a probe: no token), if what listens at `api`
/// answers it as JSON within `within`.
pub fn health(api: &str, within: Duration) -> Option<serde_json::Value> {
    exchange(api, "GET", "/health", &[], b"", within)
        .ok()
        .filter(|(status, _)| *status == 200)
        .and_then(|(_, body)| serde_json::from_str(&body).ok())
}

/// Connects to the first of `addr`'s addresses that accepts within `within`.
fn connect(addr: &str, within: Duration) -> std::io::Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&a, within) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name resolves to no address",
        )
    }))
}

/// One HTTP exchange with exactly `headers`; answers (status, body).
fn exchange(
    api: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    within: Duration,
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
    let mut stream = connect(&addr, within).map_err(unreachable)?;
    stream.set_read_timeout(Some(within)).map_err(unreachable)?;
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
pub fn shown(
    node: NodeApi<'_>,
    path: &str,
    json: bool,
    render: fn(&serde_json::Value) -> String,
) -> i32 {
    match request_to(node, "GET", path, &[], b"") {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_environment_else_the_named_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let from_env = Credential::lookup(Some(" t0k \n".into()), Some(dir.path().into()));
        assert_eq!(from_env.token.as_deref(), Some("t0k"));
        assert_eq!(from_env.source, TokenSource::Env);

        let file = dir.path().join(TOKEN_FILE);
        let missing = Credential::lookup(None, Some(dir.path().into()));
        assert_eq!(missing.token, None);
        assert_eq!(missing.source, TokenSource::Missing(file.clone()));
        assert!(missing.sent().contains(&file.display().to_string()));

        std::fs::write(&file, "from-file\n").unwrap();
        let found = Credential::lookup(Some(String::new()), Some(dir.path().into()));
        assert_eq!(found.token.as_deref(), Some("from-file"));
        assert_eq!(found.source, TokenSource::File(file));
    }

    #[test]
    fn a_refusal_names_the_flag_that_sends_the_nodes_own_token() {
        let node = Path::new("/srv/x");
        let wrong = TokenSource::File(PathBuf::from("crewlet-data").join(TOKEN_FILE));
        let said = fix(&wrong, Some(node), "read");
        assert!(said.contains("--data-dir /srv/x"), "{said}");
        assert!(said.contains("CREWLET_DATA_DIR=/srv/x"), "{said}");
        assert!(said.contains("/srv/x/operator.token"), "{said}");
        assert!(said.contains("CREWLET_TOKEN"), "{said}");

        let none = fix(
            &TokenSource::Missing("crewlet-data/operator.token".into()),
            None,
            "admin",
        );
        assert!(none.contains("--data-dir DIR"), "{none}");
        assert!(none.contains("scope admin"), "{none}");

        let env = fix(&TokenSource::Env, Some(node), "read");
        assert!(env.starts_with("unset CREWLET_TOKEN"), "{env}");

        let own = fix(
            &TokenSource::File(node.join(TOKEN_FILE)),
            Some(node),
            "read",
        );
        assert!(own.contains("no longer live"), "{own}");
    }
}
