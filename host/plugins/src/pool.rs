//! The outbound connections of one provider plugin, kept between calls.
//!
//! Rules, and why:
//! - A provider gets a fresh instance per call, so no key outlives the call;
//!   its connection to the vendor may. Without a pool every model call (and
//!   so every tool round of a turn) paid a TCP connect and a TLS handshake —
//!   100 ms and more to a real vendor — and the TLS roots were parsed again.
//! - One pool per loaded plugin, never shared between plugins, holding only
//!   transport: every request carries its own headers, key included.
//! - A request reaches the pool only after [`crate::outbound::OutboundPolicy`]
//!   admitted its origin; the pool never follows redirects.
//! - Idle connections close after [`IDLE`]; a connect is bounded by
//!   [`CONNECT_TIMEOUT`], the first response byte by the request's own
//!   option (or [`FIRST_BYTE_TIMEOUT`]), and the whole call by the plugin's
//!   deadline.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody};

/// How long an idle connection is kept.
pub const IDLE: Duration = Duration::from_secs(60);
/// Longest a TCP connect and TLS handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a response's head when the request sets no bound.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(600);

/// The connections of one plugin (cheap to clone: the pool is shared).
#[derive(Clone, Debug)]
pub struct Connections {
    client: Client<HttpsConnector<HttpConnector>, WasiBody>,
}

impl Default for Connections {
    fn default() -> Self {
        Connections::new()
    }
}

impl Connections {
    pub fn new() -> Connections {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        tcp.set_nodelay(true);
        let tls = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE)
            .pool_timer(TokioTimer::new())
            .build(tls);
        Connections { client }
    }

    /// Sends `request` on a pooled connection to its origin (opening one if
    /// none is idle). The response body is handed on as it arrives.
    pub async fn send(
        &self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<http::Response<WasiBody>, HttpError> {
        let first_byte = options
            .and_then(|o| o.first_byte_timeout)
            .unwrap_or(FIRST_BYTE_TIMEOUT);
        let response = tokio::time::timeout(first_byte, self.client.request(request))
            .await
            .map_err(|_| HttpError::HttpResponseTimeout)?
            .map_err(classify)?;
        Ok(response.map(|body| body.map_err(HttpError::from).boxed_unsync()))
    }
}

/// A failed request as `wasi:http` names it.
fn classify(e: hyper_util::client::legacy::Error) -> HttpError {
    if e.is_connect() {
        let text = format!("{e:?}");
        if text.contains("timed out") || text.contains("Elapsed") {
            HttpError::ConnectionTimeout
        } else if text.contains("Tls") || text.contains("certificate") {
            HttpError::TlsProtocolError
        } else {
            HttpError::ConnectionRefused
        }
    } else {
        match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<hyper::Error>()) {
            Some(h) if h.is_incomplete_message() || h.is_closed() => {
                HttpError::ConnectionTerminated
            }
            _ => HttpError::HttpProtocolError,
        }
    }
}
