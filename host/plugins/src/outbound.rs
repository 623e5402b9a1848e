//! Outbound HTTP for provider plugins: every request checked against the
//! manifest's `allowed_outbound_hosts`.
//!
//! Rules, and why:
//! - The check is on scheme, host and port together: `http://` to a host
//!   allowed for `https://` is a different origin and could leak a key in
//!   clear text.
//! - The host never follows redirects; the guest does, so every hop arrives
//!   here as its own request and is checked like the first.
//! - A refused request is `HttpRequestDenied` for the guest and a log line
//!   naming the origin and the manifest line that would allow it.
//! - Admitted requests go over the plugin's kept connections
//!   ([`crate::pool`]), so a call does not pay a handshake.
//! - Response bodies are capped; a larger one ends the body stream with
//!   `HttpResponseBodySize`, so a hostile or broken server cannot make the
//!   host buffer without bound.
//! - From the request's send to its response body's end, the exchange is a
//!   wait of the host's ([`crate::whereabouts::HostWait`]): a deadline that
//!   passes then is the vendor's, not charged to the plugin's breaker.

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::manifest::Origin;
use crate::pool::Connections;
use crate::whereabouts::{HostWait, Whereabouts};

/// The largest response body a provider may read, in bytes.
pub const MAX_RESPONSE_BODY: usize = 16 * 1024 * 1024;

/// The outbound rules of one plugin instance.
#[derive(Clone, Debug, Default)]
pub struct OutboundPolicy {
    plugin: String,
    manifest: String,
    allowed: Vec<Origin>,
    body_cap: usize,
    denied: Arc<Mutex<Vec<String>>>,
    /// The plugin's kept connections; `None`: a connection per request.
    connections: Option<Connections>,
    /// The instance's whereabouts, each exchange counted as a host wait.
    waits: Option<Arc<Whereabouts>>,
}

impl OutboundPolicy {
    /// Nothing allowed: the policy of webhook and module plugins (whose
    /// worlds do not even link `wasi:http`).
    pub fn deny_all() -> OutboundPolicy {
        OutboundPolicy::default()
    }

    /// Allows exactly `allowed`.
    pub fn new(
        plugin: &str,
        manifest: &str,
        allowed: Vec<Origin>,
        denied: Arc<Mutex<Vec<String>>>,
    ) -> Self {
        OutboundPolicy {
            plugin: plugin.to_string(),
            manifest: manifest.to_string(),
            allowed,
            body_cap: MAX_RESPONSE_BODY,
            denied,
            connections: None,
            waits: None,
        }
    }

    /// This policy, counting its exchanges as waits of `whereabouts`' instance.
    pub(crate) fn waited_by(&mut self, whereabouts: &Arc<Whereabouts>) -> &mut Self {
        if self.waits.is_none() {
            self.waits = Some(whereabouts.clone());
        }
        self
    }

    /// Sends admitted requests over `connections` (the plugin's pool).
    pub fn with_connections(mut self, connections: Connections) -> Self {
        self.connections = Some(connections);
        self
    }

    /// The origin of `uri` if it is allowed, else the refusal's text.
    pub fn check(&self, uri: &http::Uri) -> Result<(), String> {
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        let origin = Origin { scheme, host, port };
        if self.allowed.contains(&origin) {
            Ok(())
        } else {
            Err(origin.to_string())
        }
    }
}

impl WasiHttpHooks for OutboundPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<
        dyn Future<
                Output = Result<
                    (
                        http::Response<WasiBody>,
                        Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                    ),
                    HttpError,
                >,
            > + Send,
    > {
        drop(fut);
        if let Err(origin) = self.check(request.uri()) {
            tracing::warn!(
                plugin = %self.plugin,
                origin = %origin,
                "outbound request denied: add \"{origin}\" to provider.allowed_outbound_hosts in {} to allow it",
                self.manifest
            );
            self.denied
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(origin);
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let cap = self.body_cap;
        // Held by the exchange's future, then by its body until that ends.
        let wait = self.waits.as_ref().map(|w| w.host_wait());
        let capped = move |response: http::Response<WasiBody>, wait: Option<HostWait>| {
            response.map(|body| {
                http_body_util::Limited::new(body, cap)
                    .map_err(move |_| HttpError::HttpResponseBodySize(Some(cap as u64)))
                    .map_frame(move |frame| {
                        let _waiting = &wait;
                        frame
                    })
                    .boxed_unsync()
            })
        };
        match self.connections.clone() {
            Some(pool) => Box::new(async move {
                let response = pool.send(request, options).await?;
                // The pool drives its connections itself.
                let io = async { Ok(()) };
                Ok((
                    capped(response, wait),
                    Box::new(io) as Box<dyn Future<Output = _> + Send>,
                ))
            }),
            None => Box::new(async move {
                let (response, io) =
                    wasmtime_wasi_http::default_send_request(request, options).await?;
                let response = capped(response.map(BodyExt::boxed_unsync), wait);
                Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_host_and_port_must_all_match() {
        let policy = OutboundPolicy::new(
            "p",
            "plugin.toml",
            vec![Origin::parse("https://api.example.com").unwrap()],
            Arc::default(),
        );
        let ok: http::Uri = "https://API.example.com/v1/x".parse().unwrap();
        assert_eq!(policy.check(&ok), Ok(()));
        let clear: http::Uri = "http://api.example.com/v1".parse().unwrap();
        assert_eq!(
            policy.check(&clear),
            Err("http://api.example.com:80".to_string())
        );
        let port: http::Uri = "https://api.example.com:8443/".parse().unwrap();
        assert!(policy.check(&port).is_err());
    }
}
