//! The github webhook plugin: verification and parsing live in
//! `crewlet_webhook_core::github`; this crate only exports them.

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};
use crewlet_webhook_core::{component, github};

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        component::verify(req, github::verify)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        component::parse(req, github::parse)
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
