//! A captured request run through a webhook plugin, offline: what
//! `crewlet plugins try` prints, and what a node records of the deliveries
//! it refused (so a failing sender can be replayed without the sender).
//!
//! Rules, and why:
//! - **One shape for both ends.** The node writes a refused request as a
//!   [`Capture`] and `plugins try` reads the same JSON, so what was
//!   refused is what is replayed: route, headers, body, and the instant it
//!   arrived (a signed timestamp verifies against it, not against today).
//! - **No secret in a capture.** Credential headers (`authorization`,
//!   `cookie`, `proxy-authorization`) are dropped, and every form of the
//!   route's secrets is scrubbed from what is kept; a signature (a MAC of
//!   the body) is not a secret and stays, so the replay verifies.
//! - **The same calls the edge makes**: verify, then parse only when
//!   verify passed, on one fresh instance whose stderr and `log` lines are
//!   returned with the answers (scrubbed of the secrets the call was
//!   handed, bounded).
//!
//! A provider's one call ([`provider`]) and a module's one event or tool
//! call ([`module`]) are tried from requests written by hand.

pub mod module;
pub mod provider;

use std::sync::Arc;

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::runtime::CallError;
use crate::scrub::Scrub;
use crate::webhook::{
    ParseError, Parsed, Request, Unbounded, VerifyError, WebhookPlugin, check_bounds,
};

/// Headers never kept in a capture: they carry credentials, not
/// signatures.
const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];

/// A request as it reached a webhook route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capture {
    /// `/webhooks/SOURCE` (or `/webhooks/SOURCE/HANDLE`).
    pub route: String,
    /// Lower-cased names, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body, base64 (it may be any bytes).
    pub body_base64: String,
    /// When it arrived, in Unix seconds: the `now` verify is given.
    pub received_unix: i64,
    /// Why the node refused it, when a node recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Capture {
    /// A capture of a request, without credential headers and with every
    /// form of `secrets` scrubbed from the headers kept.
    pub fn of(
        route: &str,
        headers: impl IntoIterator<Item = (String, String)>,
        body: &[u8],
        received_unix: i64,
        secrets: &[&[u8]],
    ) -> Capture {
        let scrub = Scrub::of(secrets.iter().copied());
        Capture {
            route: route.to_string(),
            headers: headers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .filter(|(n, _)| !CREDENTIAL_HEADERS.contains(&n.as_str()))
                .map(|(n, v)| (n, scrub.replace(&v)))
                .collect(),
            body_base64: base64::engine::general_purpose::STANDARD
                .encode(scrub.body(body.to_vec()).unwrap_or_default()),
            received_unix,
            refused: None,
        }
    }

    /// The body's bytes; `Err` names what is wrong with the field.
    pub fn body(&self) -> Result<Vec<u8>, TrialInputError> {
        base64::engine::general_purpose::STANDARD
            .decode(&self.body_base64)
            .map_err(TrialInputError::Body)
    }

    /// The request a plugin gets, with `secrets` (name, value).
    pub fn request(&self, secrets: &[(&str, &[u8])]) -> Result<Request, TrialInputError> {
        let headers: Vec<(&str, &str)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        Ok(Request::new(
            &self.route,
            &headers,
            &self.body()?,
            secrets,
            self.received_unix,
        ))
    }
}

/// Why a capture or a hand-written request cannot be tried: the file's
/// fault, naming its field; fix the file.
#[derive(Debug, thiserror::Error)]
pub enum TrialInputError {
    #[error("body_base64 is not base64: {0}")]
    Body(base64::DecodeError),
    #[error("messages[{index}].role is {role:?}; one of system, user, assistant, tool")]
    Role { index: usize, role: String },
    #[error("tool_choice {0:?} is not auto, none, required or a listed tool")]
    ToolChoice(String),
}

/// What the plugin made of a capture.
#[derive(Debug)]
pub struct WebhookTrial {
    pub verify: Result<(), VerifyError>,
    /// `None` when verify refused (parse is never run then).
    pub parse: Option<Result<Parsed, ParseError>>,
    /// The host's bounds on what parse returned.
    pub bounds: Option<Result<(), Unbounded>>,
    /// What the plugin wrote to stderr, scrubbed and bounded.
    pub said: String,
    /// The lines it wrote through `log`, scrubbed and bounded.
    pub logged: Vec<String>,
}

impl WebhookPlugin {
    /// Verify, then (when it passed) parse, on one fresh instance, with its
    /// stderr; `Err` is a fault (or the plugin was not run).
    pub async fn trial(&self, req: Request) -> Result<WebhookTrial, CallError> {
        let req = self.declared_only(req);
        let speaker = self.speaker();
        let mark = speaker.mark();
        let mut trial = self
            .run(
                req,
                false,
                move |bindings, mut store, req: Arc<Request>| async move {
                    let verify = match bindings.verify(&mut store, &req).await {
                        Ok(v) => v,
                        Err(e) => return (store, bindings, Err(e)),
                    };
                    let parse = match &verify {
                        Ok(()) => match bindings.parse(&mut store, &req).await {
                            Ok(p) => Some(p),
                            Err(e) => return (store, bindings, Err(e)),
                        },
                        Err(_) => None,
                    };
                    let said = store.data().said();
                    let bounds = match &parse {
                        Some(Ok(parsed)) => Some(check_bounds(parsed)),
                        _ => None,
                    };
                    (
                        store,
                        bindings,
                        Ok(WebhookTrial {
                            verify,
                            parse,
                            bounds,
                            said,
                            logged: Vec::new(),
                        }),
                    )
                },
            )
            .await?;
        trial.logged = speaker.logged_since(mark);
        Ok(trial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_keeps_the_signature_and_drops_credentials_and_secrets() {
        let c = Capture::of(
            "/webhooks/slack",
            [
                ("X-Slack-Signature".to_string(), "v0=abc".to_string()),
                ("Authorization".to_string(), "Bearer tok".to_string()),
                ("X-Echo".to_string(), "the key is s3cr3t-value".to_string()),
            ],
            b"{\"a\":1}",
            1_700_000_000,
            &[b"s3cr3t-value"],
        );
        assert_eq!(c.headers[0], ("x-slack-signature".into(), "v0=abc".into()));
        assert!(c.headers.iter().all(|(n, _)| n != "authorization"));
        assert!(!serde_json::to_string(&c).unwrap().contains("s3cr3t-value"));
        assert_eq!(c.body().unwrap(), b"{\"a\":1}");
        let back: Capture = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
}
