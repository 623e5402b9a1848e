//! The gitlab webhook plugin: verification and parsing live in
//! `crewlet_webhook_core::gitlab`; this crate only exports them.

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};
use crewlet_webhook_core::{component, gitlab};

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        component::verify(req, gitlab::verify)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        component::parse(req, gitlab::parse)
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
