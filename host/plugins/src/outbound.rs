//! Outbound HTTP for provider plugins: every request checked against the
//! manifest's `allowed_outbound_hosts`.
//!
//! Rules, and why:
//! - The check is on scheme, host and port together: `http://` to a host
//!   allowed for `https://` is a different origin and could leak a key in
//!   clear text.
//! - The host never follows redirects; the guest does, so every hop arrives
//!   here as its own request and is checked like the first.
//! - The allowed origins are the effective ones (`crate::grant`: those
//!   declared, plus those the operator adds, minus those the operator
//!   denies); this check is the one choke point every request passes, the
//!   base URL's included.
//! - A refused request is `HttpRequestDenied` for the guest, whether the
//!   origin was never declared or the operator denies it, and a log line
//!   saying which ([`NotHeld`]): the manifest line that would allow it, or
//!   the operator's key that denies it. The call keeps the last refusal
//!   ([`OutboundPolicy::refused`]) so its failure can name it.
//! - Admitted requests go over the plugin's kept connections
//!   ([`crate::pool`]), so a call does not pay a handshake.
//! - Response bodies are capped; a larger one ends the body stream with
//!   `HttpResponseBodySize`, so a hostile or broken server cannot make the
//!   host buffer without bound.
//! - From the request's send to its response body's end, the exchange is a
//!   wait of the host's ([`crate::whereabouts::HostWait`]): a deadline that
//!   passes then is the vendor's, not charged to the plugin's breaker.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::manifest::{Granted, NotHeld, Origin, Permission};
use crate::pool::Connections;
use crate::whereabouts::{HostWait, Whereabouts};

/// The largest response body a provider may read, in bytes.
pub const MAX_RESPONSE_BODY: usize = 16 * 1024 * 1024;

/// The outbound rules of one plugin instance.
#[derive(Clone, Debug, Default)]
pub struct OutboundPolicy {
    plugin: String,
    manifest: PathBuf,
    allowed: Vec<Origin>,
    /// What the operator's grant did, to name a deny in a refusal.
    granted: Arc<Granted>,
    body_cap: usize,
    denied: Arc<Mutex<Vec<String>>>,
    /// This policy's last refusal.
    refused: Arc<Mutex<Option<NotHeld>>>,
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

    /// Allows exactly `allowed` (the effective origins of `manifest`);
    /// each refused origin is added to `denied`.
    pub fn new(
        plugin: &str,
        manifest: &Path,
        allowed: Vec<Origin>,
        denied: Arc<Mutex<Vec<String>>>,
    ) -> Self {
        OutboundPolicy {
            plugin: plugin.to_string(),
            manifest: manifest.to_path_buf(),
            allowed,
            granted: Arc::default(),
            body_cap: MAX_RESPONSE_BODY,
            denied,
            refused: Arc::default(),
            connections: None,
            waits: None,
        }
    }

    /// Names what the operator's grant denies in a refusal.
    pub fn with_grant(mut self, granted: Arc<Granted>) -> Self {
        self.granted = granted;
        self
    }

    /// Where this policy keeps its last refusal.
    pub fn refused(&self) -> Arc<Mutex<Option<NotHeld>>> {
        self.refused.clone()
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

    /// Whether the origin of `uri` is allowed; else why not.
    pub fn check(&self, uri: &http::Uri) -> Result<(), NotHeld> {
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        let origin = Origin { scheme, host, port };
        if self.allowed.contains(&origin) {
            Ok(())
        } else {
            let outbound = Permission::Outbound(origin);
            Err(self.granted.refusal(outbound, &self.manifest))
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
        if let Err(why) = self.check(request.uri()) {
            let origin = match &why {
                NotHeld::Undeclared { permission, .. } | NotHeld::Denied { permission, .. } => {
                    permission.value()
                }
            };
            match &why {
                NotHeld::Undeclared { .. } => tracing::warn!(
                    plugin = %self.plugin,
                    origin = %origin,
                    "outbound request denied: add \"{origin}\" to provider.allowed_outbound_hosts in {} to allow it",
                    self.manifest.display()
                ),
                NotHeld::Denied { .. } => tracing::warn!(
                    plugin = %self.plugin,
                    origin = %origin,
                    "outbound request denied: {why}"
                ),
            }
            self.denied
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(origin);
            *self.refused.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
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
            Path::new("plugin.toml"),
            vec![Origin::parse("https://api.example.com").unwrap()],
            Arc::default(),
        );
        let ok: http::Uri = "https://API.example.com/v1/x".parse().unwrap();
        assert_eq!(policy.check(&ok), Ok(()));
        let clear: http::Uri = "http://api.example.com/v1".parse().unwrap();
        let refused = policy.check(&clear).unwrap_err();
        assert!(
            matches!(&refused, NotHeld::Undeclared { permission, .. } if permission.value() == "http://api.example.com:80"),
            "{refused:?}"
        );
        let port: http::Uri = "https://api.example.com:8443/".parse().unwrap();
        assert!(policy.check(&port).is_err());
    }

    #[test]
    fn an_origin_the_operator_denies_is_refused_naming_the_key() {
        let api = Origin::parse("https://api.example.com").unwrap();
        let granted = Granted {
            source: "node.toml".into(),
            added: Vec::new(),
            denied: vec![crate::manifest::ByOperator {
                permission: Permission::Outbound(api),
                key: "plugins.grants.p.denied_outbound_hosts[0]".into(),
            }],
        };
        let other = Origin::parse("https://other.example.com").unwrap();
        let policy =
            OutboundPolicy::new("p", Path::new("plugin.toml"), vec![other], Arc::default())
                .with_grant(Arc::new(granted));
        let uri: http::Uri = "https://api.example.com/v1".parse().unwrap();
        let refused = policy.check(&uri).unwrap_err();
        assert!(matches!(refused, NotHeld::Denied { .. }), "{refused:?}");
        assert!(
            refused
                .to_string()
                .contains("`plugins.grants.p.denied_outbound_hosts[0]` in node.toml"),
            "{refused}"
        );
        let other: http::Uri = "https://other.example.com/".parse().unwrap();
        assert_eq!(policy.check(&other), Ok(()));
    }
}
