//! The atlassian webhook plugin: verification and parsing live in
//! `crewlet_webhook_core::atlassian`; this crate only exports them.

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};
use crewlet_webhook_core::{atlassian, component};

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        component::verify(req, atlassian::verify)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        component::parse(req, atlassian::parse)
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
