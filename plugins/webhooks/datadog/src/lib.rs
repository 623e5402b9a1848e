//! The datadog webhook plugin: verification and parsing live in
//! `crewlet_webhook_core::datadog`; this crate only exports them.

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};
use crewlet_webhook_core::{component, datadog};

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        component::verify(req, datadog::verify)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        component::parse(req, datadog::parse)
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
