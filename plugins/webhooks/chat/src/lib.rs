//! The chat webhook plugin: verification and parsing live in
//! `crewlet_webhook_core::chat`; this crate only exports them.

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};
use crewlet_webhook_core::{chat, component};

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        component::verify(req, chat::verify)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        component::parse(req, chat::parse)
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
