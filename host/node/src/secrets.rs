//! The company's secrets on this node: `PUT`/`DELETE /secrets/{name}`,
//! `GET /secrets`, and `crewlet secrets set|list|rm` against a running node.
//!
//! The mirror itself ([`Secrets`]: the fleet's secrets bucket, kept current
//! by a watch, with this node's environment as the fallback) lives in
//! `crewlet-ingress`, whose webhook edge is its first reader; it is in the
//! engine context as `secrets`.
//!
//! Rules: a value is never logged, never echoed and never listed — the API
//! answers names and update times only; a name follows the company
//! document's rule for secret names (400 otherwise); a value is UTF-8 text
//! of at most 64 KiB (413 above it). An unreachable bucket is 503 with
//! Retry-After and changes nothing.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, put};
use crewlet_api::retry_later;
use serde_json::json;
use tracing::{info, warn};

pub use crewlet_ingress::secrets::{
    Listed, MAX_SECRET_BYTES, Resolver, Secrets, SecretsError, check_name,
};

use crate::engine::Late;

/// Seconds a caller is told to wait when the bucket cannot be reached.
const RETRY_AFTER_SECONDS: u64 = 2;

/// The secrets routes, bound with the HTTP surface (503 until the engine is up).
pub fn routes(late: Late) -> Router {
    Router::new()
        .route("/secrets", get(list_secrets))
        .route("/secrets/{name}", put(put_secret).delete(delete_secret))
        // One byte over the cap, so the handler (not the layer) says 413
        // with the secret's name in the message.
        .layer(DefaultBodyLimit::max(MAX_SECRET_BYTES + 1))
        .with_state(late)
}

fn error(status: StatusCode, kind: &str, detail: String) -> Response {
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return retry_later(RETRY_AFTER_SECONDS, kind, detail);
    }
    (status, Json(json!({ "error": kind, "detail": detail }))).into_response()
}

fn failure(e: SecretsError) -> Response {
    let status = match &e {
        SecretsError::BadName(_) => StatusCode::BAD_REQUEST,
        SecretsError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        SecretsError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        SecretsError::Corrupt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, "secrets", e.to_string())
}

fn not_up() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "starting",
        "the node's engine is not up yet; retry in a few seconds".into(),
    )
}

async fn put_secret(State(late): State<Late>, Path(name): Path<String>, body: Bytes) -> Response {
    if let Err(e) = check_name(&name) {
        return failure(e);
    }
    let Some(ctx) = late.get() else {
        return not_up();
    };
    let Ok(value) = std::str::from_utf8(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "secrets",
            format!("the value of {name} is not UTF-8 text; send the secret as text"),
        );
    };
    match ctx.secrets.set(&name, value).await {
        Ok(_) => {
            info!(subsystem = "secrets", secret = %name, "secret set");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => {
            warn!(subsystem = "secrets", secret = %name, error = %e, "secret not set");
            failure(e)
        }
    }
}

async fn delete_secret(State(late): State<Late>, Path(name): Path<String>) -> Response {
    if let Err(e) = check_name(&name) {
        return failure(e);
    }
    let Some(ctx) = late.get() else {
        return not_up();
    };
    match ctx.secrets.remove(&name).await {
        Ok(true) => {
            info!(subsystem = "secrets", secret = %name, "secret removed");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            "no_such_secret",
            format!("no secret named {name} is set; `crewlet secrets list` shows the names"),
        ),
        Err(e) => failure(e),
    }
}

async fn list_secrets(State(late): State<Late>) -> Response {
    let Some(ctx) = late.get() else {
        return not_up();
    };
    match ctx.secrets.list().await {
        Ok(listed) => Json(json!({ "secrets": listed })).into_response(),
        Err(e) => failure(e),
    }
}

// ---- `crewlet secrets` ---------------------------------------------------------

/// Why a `crewlet secrets` command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum SecretsCliError {
    #[error(transparent)]
    BadName(SecretsError),
    #[error("cannot read the secret's value from stdin: {0}")]
    Stdin(std::io::Error),
    #[error(
        "the value on stdin is empty; pipe the secret in, e.g. `printf %s \"$VALUE\" | crewlet secrets set NAME`"
    )]
    Empty,
    #[error(transparent)]
    Http(#[from] crate::configplane::ImportError),
    #[error("the node at {api} answered {status}: {body}")]
    Refused {
        api: String,
        status: u16,
        body: String,
    },
}

impl SecretsCliError {
    /// 2 for a request the node (or the CLI) refused as wrong, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            SecretsCliError::BadName(_) | SecretsCliError::Empty => 2,
            SecretsCliError::Refused { status, .. } if (400..500).contains(status) => 2,
            _ => 1,
        }
    }
}

/// The value as read from stdin: one trailing newline (`\n` or `\r\n`)
/// trimmed, so `echo VALUE |` sets `VALUE`.
pub fn value_from(raw: &str) -> &str {
    raw.strip_suffix('\n')
        .map(|v| v.strip_suffix('\r').unwrap_or(v))
        .unwrap_or(raw)
}

/// `crewlet secrets set NAME` with the value read from `input`.
pub fn cli_set(
    api: &str,
    name: &str,
    input: &mut impl std::io::Read,
) -> Result<String, SecretsCliError> {
    check_name(name).map_err(SecretsCliError::BadName)?;
    let mut raw = String::new();
    input
        .read_to_string(&mut raw)
        .map_err(SecretsCliError::Stdin)?;
    let value = value_from(&raw);
    if value.is_empty() {
        return Err(SecretsCliError::Empty);
    }
    expect_ok(
        api,
        crate::configplane::http_request(
            api,
            "PUT",
            &format!("/secrets/{name}"),
            value.as_bytes(),
        )?,
    )?;
    Ok(format!("set {name} through {api}"))
}

/// `crewlet secrets rm NAME`.
pub fn cli_remove(api: &str, name: &str) -> Result<String, SecretsCliError> {
    check_name(name).map_err(SecretsCliError::BadName)?;
    expect_ok(
        api,
        crate::configplane::http_request(api, "DELETE", &format!("/secrets/{name}"), b"")?,
    )?;
    Ok(format!("removed {name} through {api}"))
}

/// `crewlet secrets list`: one line per secret, name and update time.
pub fn cli_list(api: &str) -> Result<String, SecretsCliError> {
    let body = expect_ok(
        api,
        crate::configplane::http_request(api, "GET", "/secrets", b"")?,
    )?;
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut out = String::new();
    for s in answer["secrets"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or("?");
        let updated = s["updated_ms"]
            .as_u64()
            .map(|ms| {
                let at = time::OffsetDateTime::UNIX_EPOCH + Duration::from_millis(ms);
                at.format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
            })
            .unwrap_or_default();
        out.push_str(&format!("{name}\t{updated}\n"));
    }
    Ok(out)
}

fn expect_ok(api: &str, (status, body): (u16, String)) -> Result<String, SecretsCliError> {
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        Err(SecretsCliError::Refused {
            api: api.to_owned(),
            status,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_trimmed_and_nothing_else() {
        assert_eq!(value_from("abc\n"), "abc");
        assert_eq!(value_from("abc\r\n"), "abc");
        assert_eq!(value_from("abc"), "abc");
        assert_eq!(value_from("abc\n\n"), "abc\n");
        assert_eq!(value_from(" abc \n"), " abc ");
    }

    #[test]
    fn a_bad_name_is_refused_before_any_request() {
        let err = cli_set("http://127.0.0.1:1", "1BAD", &mut "v".as_bytes()).unwrap_err();
        assert!(matches!(err, SecretsCliError::BadName(_)), "{err}");
        assert_eq!(err.exit_code(), 2);
        let err = cli_set("http://127.0.0.1:1", "GOOD", &mut "\n".as_bytes()).unwrap_err();
        assert!(matches!(err, SecretsCliError::Empty), "{err}");
    }
}
