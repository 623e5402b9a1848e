//! Per-seat webhook routes of a vendor that signs each app with a secret
//! of its own (Slack issues one signing secret per app): a seat that
//! claims an identity there is its own app, so its route
//! `/webhooks/SOURCE/HANDLE` needs that app's secret. Without
//! `[seats.X] signing_secrets` the route verifies with the integration's
//! secret, and every delivery Slack signs with the seat's app secret is
//! refused 401 — a warning, not a failure: the seat may share the source's
//! app.

use crewlet_company::Company;

use super::{Finding, Verdict, bad, ok};

/// Sources whose vendor issues a signing secret per app.
const PER_APP_SECRET: [&str; 1] = ["slack"];

/// One finding per seat with an identity on such an integrated source.
pub(super) fn seat_routes(company: &Company) -> Vec<Finding> {
    let mut out = Vec::new();
    for source in PER_APP_SECRET {
        let Some(integration) = company.integrations.get(source) else {
            continue;
        };
        for seat in company.seats.values() {
            if seat.identities.get(source).is_none_or(Vec::is_empty) {
                continue;
            }
            let route = format!("/webhooks/{source}/{}", seat.handle);
            out.push(match seat.signing_secrets.get(source) {
                Some(own) => ok(
                    "seat route",
                    format!("{route} verifies with the seat's own {}", own.name_str()),
                ),
                None => bad(
                    "seat route",
                    Verdict::Warn,
                    format!(
                        "{route} has no signing secret of its own: seat {h} claims a {source} identity (its own app, which {source} signs with that app's secret), and the route verifies with the source's {}",
                        integration.secret.name_str(),
                        h = seat.handle
                    ),
                    format!(
                        "`[seats.{h}] signing_secrets = {{ {source} = \"${{{upper}_{SRC}_SIGNING_SECRET}}\" }}` with the app's secret set under that name; leave it if {h} shares the source's app",
                        h = seat.handle,
                        upper = seat.handle.as_str().to_ascii_uppercase().replace('-', "_"),
                        SRC = source.to_ascii_uppercase()
                    ),
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seat_with_a_slack_identity_and_no_secret_of_its_own_is_named() {
        let company = Company::parse(
            r#"
            [org]
            name = "Acme"
            [roles.eng]
            system_prompt = "x"
            executor = [{ provider = "openai", model = "m" }]
            reviewer = { provider = "openai", model = "m" }
            [seats.ada]
            role = "eng"
            identities = { slack = "U04ABCDEF" }
            signing_secrets = { slack = "ADA_SLACK_SIGNING_SECRET" }
            [seats.linus]
            role = "eng"
            identities = { slack = "U05LINUS1" }
            [seats.grace]
            role = "eng"
            [integrations.slack]
            plugin = "slack"
            secret = "SLACK_SIGNING_SECRET"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let found = seat_routes(&company);
        assert_eq!(found.len(), 2, "grace claims no Slack id: {found:?}");
        assert_eq!(found[0].verdict, Verdict::Ok);
        assert!(found[0].detail.contains("/webhooks/slack/ada"));
        assert_eq!(found[1].verdict, Verdict::Warn);
        assert!(
            found[1].detail.contains("/webhooks/slack/linus")
                && found[1].detail.contains("SLACK_SIGNING_SECRET"),
            "{found:?}"
        );
        let fix = found[1].fix.as_deref().unwrap_or_default();
        assert!(fix.contains("LINUS_SLACK_SIGNING_SECRET"), "{fix}");
    }
}
