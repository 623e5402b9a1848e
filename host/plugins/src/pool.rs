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

/// A failed request as `wasi:http` names it, from the error's causes.
fn classify(e: hyper_util::client::legacy::Error) -> HttpError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            // rustls reports through io errors whose inner error is its own.
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return HttpError::TlsProtocolError;
            }
            match io.kind() {
                std::io::ErrorKind::TimedOut => return HttpError::ConnectionTimeout,
                std::io::ErrorKind::ConnectionRefused => return HttpError::ConnectionRefused,
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => {
                    return HttpError::ConnectionTerminated;
                }
                _ => {}
            }
        }
        if let Some(h) = c.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_closed())
        {
            return HttpError::ConnectionTerminated;
        }
        cause = c.source();
    }
    if e.is_connect() {
        HttpError::DestinationUnavailable
    } else {
        HttpError::HttpProtocolError
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_a_refused_connection() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let request = http::Request::post(format!("http://127.0.0.1:{port}/v1"))
            .body(
                http_body_util::Empty::new()
                    .map_err(|never: std::convert::Infallible| match never {})
                    .boxed_unsync(),
            )
            .unwrap();
        let err = Connections::new().send(request, None).await.unwrap_err();
        assert!(matches!(err, HttpError::ConnectionRefused), "{err}");
    }
}
