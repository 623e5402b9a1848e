//! The `Host` allow-list: the names this node answers to.
//!
//! A web page on another site can make a browser send requests here by
//! pointing its own name at this address (DNS rebinding); such a request
//! carries that site's name in `Host`. Answering only the names the
//! operator expects — loopback names and the bound address by default,
//! more in `[api] allowed_hosts` — shuts that door for every route but the
//! webhooks, whose senders use public names and prove themselves with a
//! signature instead (they hold no ambient credential a page could borrow).
//! `*` in the list accepts any name.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};

/// The names a node answers to (port-insensitive, case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts {
    names: Vec<String>,
    any: bool,
}

impl AllowedHosts {
    /// Loopback names, the bound address unless it is a wildcard, and
    /// `extra` (the config's `allowed_hosts`).
    pub fn new(bound: IpAddr, extra: &[String]) -> AllowedHosts {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        if !bound.is_unspecified() {
            names.push(bound.to_string());
        }
        let any = extra.iter().any(|h| h == "*");
        names.extend(
            extra
                .iter()
                .filter(|h| *h != "*")
                .map(|h| h.to_ascii_lowercase()),
        );
        AllowedHosts { names, any }
    }

    /// Whether a `Host` header value names this node.
    pub fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let name = host_name(host).to_ascii_lowercase();
        let name = name.strip_suffix('.').unwrap_or(&name);
        self.names.iter().any(|n| n == name)
    }
}

/// `host[:port]` or `[v6][:port]` → the name alone.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.contains(':') => {
            name
        }
        _ => host,
    }
}

pub(crate) async fn gate(
    State(allowed): State<Arc<AllowedHosts>>,
    req: Request,
    next: Next,
) -> Response {
    if req.uri().path().starts_with("/webhooks/") {
        return next.run(req).await;
    }
    let host = req
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    match host {
        Some(h) if allowed.allows(h) => next.run(req).await,
        Some(h) => forbidden(format!(
            "the Host header {h:?} is not a name this node answers to (a page on another site reaching the API by DNS rebinding looks like this); if clients reach the node by that name, add it to [api] allowed_hosts in the node's config"
        )),
        None => forbidden(
            "the request has no Host header; send the name you reached the node by".to_owned(),
        ),
    }
}

fn forbidden(error: String) -> Response {
    (
        StatusCode::FORBIDDEN,
        Json(serde_json::json!({
            "status": "forbidden",
            "error": error,
            "header": "host",
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_bound_names_pass_and_foreign_ones_do_not() {
        let a = AllowedHosts::new(IpAddr::from([10, 0, 0, 7]), &["Crewlet.Internal".into()]);
        for ok in [
            "localhost",
            "localhost:7420",
            "127.0.0.1:1",
            "[::1]:7420",
            "10.0.0.7:7420",
            "crewlet.internal",
            "CREWLET.internal.:80",
        ] {
            assert!(a.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example.com",
            "evil.example.com:7420",
            "localhost.evil.example.com",
            "127.0.0.2",
            "",
        ] {
            assert!(!a.allows(bad), "{bad}");
        }
        let wildcard = AllowedHosts::new(IpAddr::from([0, 0, 0, 0]), &[]);
        assert!(!wildcard.allows("0.0.0.0"), "a wildcard bind is no name");
        assert!(AllowedHosts::new(IpAddr::from([127, 0, 0, 1]), &["*".into()]).allows("any.where"));
    }
}
