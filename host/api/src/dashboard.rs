//! The dashboard's static files, embedded in the binary at build time so a
//! node serves its UI with nothing beside it: no CDN, no fetch from outside
//! the node. Plain JS modules, no library; `GET /assets/{file}` answers only
//! the files listed here (anything else is the surface's 404).

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../../../dashboard/index.html");

/// Every asset by name, with its content type.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", JS, include_str!("../../../dashboard/app.js")),
    ("api.js", JS, include_str!("../../../dashboard/api.js")),
    ("dom.js", JS, include_str!("../../../dashboard/dom.js")),
    ("org.js", JS, include_str!("../../../dashboard/org.js")),
    ("turn.js", JS, include_str!("../../../dashboard/turn.js")),
    ("feed.js", JS, include_str!("../../../dashboard/feed.js")),
    ("ops.js", JS, include_str!("../../../dashboard/ops.js")),
    ("act.js", JS, include_str!("../../../dashboard/act.js")),
    ("chat.js", JS, include_str!("../../../dashboard/chat.js")),
    (
        "memory.js",
        JS,
        include_str!("../../../dashboard/memory.js"),
    ),
    (
        "style.css",
        CSS,
        include_str!("../../../dashboard/style.css"),
    ),
];
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

pub(crate) async fn index() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX)
}

pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, kind, body)) => ([(header::CONTENT_TYPE, *kind)], *body).into_response(),
        None => crate::not_found().await,
    }
}
