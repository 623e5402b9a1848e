//! The `provider` world, a small HTTP client over `wasi:http`, and the
//! [`log`] import (a line in the node's log, tagged with the plugin).

wit_bindgen::generate!({
    world: "provider",
    path: "../../wit",
    pub_export_macro: true,
    export_macro_name: "export_provider",
    default_bindings_module: "crewlet_plugin_sdk::provider",
    generate_all,
});

pub mod classify;

pub use crewlet::plugin::log;

pub use exports::crewlet::plugin::completions::{
    Completion, Credential, ErrorKind, Guest, Message, ProviderError, Request, Role, Tool,
    ToolCall, ToolChoice, Usage,
};

/// The world's second export (WIT 0.4.2): vectors for texts. Every
/// provider implements [`Embeddings`]; one whose vendor has no embeddings
/// API answers [`EmbedError::Unsupported`] saying so.
pub use exports::crewlet::plugin::embeddings::{
    EmbedError, EmbedRequest, Embedded, Guest as Embeddings,
};

pub mod http {
    //! A blocking HTTP client for one model call.
    //!
    //! Rules:
    //! - Redirects are followed by the plugin, not the host, so every hop is
    //!   a new request the host checks against `allowed_outbound_hosts`; at
    //!   most [`MAX_REDIRECTS`] hops, then [`HttpFailure::TooManyRedirects`].
    //! - A request the host refuses is [`HttpFailure::Denied`], distinct from
    //!   a network failure, so a provider can classify it as a configuration
    //!   problem rather than a transient one.
    //! - A response body over [`MAX_BODY`] is [`HttpFailure::BodyTooLarge`].

    use super::wasi::http::outgoing_handler;
    use super::wasi::http::types::{
        ErrorCode, Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
    };
    use super::wasi::io::streams::StreamError;

    /// Redirect hops followed before giving up.
    pub const MAX_REDIRECTS: usize = 5;
    /// The largest response body read, in bytes.
    pub const MAX_BODY: usize = 8 * 1024 * 1024;

    /// A response, fully read.
    #[derive(Debug, Clone)]
    pub struct Response {
        pub status: u16,
        /// Header names lower-case.
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    impl Response {
        /// The first header with this (lower-case) name.
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }
    }

    /// Why no response was obtained.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum HttpFailure {
        /// The host refused the request: its host is not in
        /// `allowed_outbound_hosts`. Carries the `scheme://host:port`.
        Denied(String),
        /// The URL is not `http(s)://authority/path`.
        BadUrl(String),
        /// More than [`MAX_REDIRECTS`] redirects.
        TooManyRedirects,
        /// The body was larger than [`MAX_BODY`].
        BodyTooLarge,
        /// The connection or protocol failed; carries the wasi error code.
        Network(String),
    }

    /// Sends `body` with `method` to `url` and returns the final response.
    pub fn send(
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, HttpFailure> {
        let mut current = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let response = send_once(method, &current, headers, body)?;
            if matches!(response.status, 301 | 302 | 303 | 307 | 308)
                && let Some(location) = response.header("location")
            {
                current = resolve(&current, location)?;
                continue;
            }
            return Ok(response);
        }
        Err(HttpFailure::TooManyRedirects)
    }

    struct Url<'a> {
        https: bool,
        authority: &'a str,
        path: &'a str,
    }

    fn split(url: &str) -> Result<Url<'_>, HttpFailure> {
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(HttpFailure::BadUrl(
                "only http:// and https:// URLs".to_string(),
            ));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(HttpFailure::BadUrl(
                "a URL needs a host and no user info".to_string(),
            ));
        }
        Ok(Url {
            https,
            authority,
            path,
        })
    }

    fn resolve(base: &str, location: &str) -> Result<String, HttpFailure> {
        if location.starts_with("http://") || location.starts_with("https://") {
            return Ok(location.to_string());
        }
        let url = split(base)?;
        let scheme = if url.https { "https" } else { "http" };
        if location.starts_with('/') {
            Ok(format!("{scheme}://{}{location}", url.authority))
        } else {
            Err(HttpFailure::BadUrl(
                "a relative redirect must start with /".to_string(),
            ))
        }
    }

    fn describe(url: &Url<'_>) -> String {
        let scheme = if url.https { "https" } else { "http" };
        format!("{scheme}://{}", url.authority)
    }

    fn failure(code: ErrorCode, url: &Url<'_>) -> HttpFailure {
        match code {
            ErrorCode::HttpRequestDenied => HttpFailure::Denied(describe(url)),
            ErrorCode::HttpResponseBodySize(_) => HttpFailure::BodyTooLarge,
            other => HttpFailure::Network(format!("{other:?}")),
        }
    }

    fn send_once(
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, HttpFailure> {
        let parsed = split(url)?;
        let mut fields: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        fields.push((
            "content-length".to_string(),
            body.len().to_string().into_bytes(),
        ));
        let fields = Fields::from_list(&fields)
            .map_err(|e| HttpFailure::BadUrl(format!("a header was refused: {e:?}")))?;
        let request = OutgoingRequest::new(fields);
        let method = match method {
            "GET" => Method::Get,
            "POST" => Method::Post,
            other => Method::Other(other.to_string()),
        };
        let scheme = if parsed.https {
            Scheme::Https
        } else {
            Scheme::Http
        };
        let set = request.set_method(&method).is_ok()
            && request.set_scheme(Some(&scheme)).is_ok()
            && request.set_authority(Some(parsed.authority)).is_ok()
            && request.set_path_with_query(Some(parsed.path)).is_ok();
        if !set {
            return Err(HttpFailure::BadUrl(
                "the host refused the URL's parts".to_string(),
            ));
        }
        let outgoing = request
            .body()
            .map_err(|()| HttpFailure::Network("request body taken twice".to_string()))?;
        let future = outgoing_handler::handle(request, None).map_err(|e| failure(e, &parsed))?;
        let written = write_body(&outgoing, body);
        let finished = written.and_then(|()| {
            OutgoingBody::finish(outgoing, None)
                .map_err(|e| format!("finishing the request body: {e:?}"))
        });
        future.subscribe().block();
        // The response (or the host's refusal) explains a failed write
        // better than the write itself: a denied request closes the body.
        let incoming = match future.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(failure(code, &parsed)),
            Some(Err(())) | None => return Err(HttpFailure::Network("response lost".to_string())),
        };
        finished.map_err(HttpFailure::Network)?;
        read_response(incoming)
    }

    fn write_body(outgoing: &OutgoingBody, body: &[u8]) -> Result<(), String> {
        let stream = outgoing
            .write()
            .map_err(|()| "request body stream taken twice".to_string())?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("writing the request body: {e:?}"))?;
        }
        Ok(())
    }

    fn read_response(incoming: IncomingResponse) -> Result<Response, HttpFailure> {
        let status = incoming.status();
        let headers = incoming
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| {
                (
                    n.to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_ref()).into_owned(),
                )
            })
            .collect();
        let body_handle = incoming
            .consume()
            .map_err(|()| HttpFailure::Network("response body taken twice".to_string()))?;
        let mut body = Vec::new();
        {
            let stream = body_handle
                .stream()
                .map_err(|()| HttpFailure::Network("response stream taken twice".to_string()))?;
            loop {
                match stream.blocking_read(64 * 1024) {
                    Ok(chunk) => {
                        if body.len() + chunk.len() > MAX_BODY {
                            return Err(HttpFailure::BodyTooLarge);
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        let detail = e.to_debug_string();
                        if detail.contains("body size") || detail.contains("BodySize") {
                            return Err(HttpFailure::BodyTooLarge);
                        }
                        return Err(HttpFailure::Network(format!(
                            "reading the response body: {detail}"
                        )));
                    }
                }
            }
        }
        drop(body_handle);
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}
