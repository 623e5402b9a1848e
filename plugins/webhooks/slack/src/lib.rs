//! The slack webhook plugin: verification and parsing live in
//! `crewlet_webhook_core::slack`; this crate only exports them.

use crewlet_plugin_sdk::webhook::{Guest, ParseError, Parsed, Request, VerifyError};
use crewlet_webhook_core::{component, slack};

struct Plugin;

impl Guest for Plugin {
    fn verify(req: Request) -> Result<(), VerifyError> {
        component::verify(req, slack::verify)
    }

    fn parse(req: Request) -> Result<Parsed, ParseError> {
        component::parse(req, slack::parse)
    }
}

crewlet_plugin_sdk::webhook::export_webhook!(Plugin);
