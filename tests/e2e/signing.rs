//! A signing secret per seat, through the real binary: two seats' Slack
//! apps, each signing with its own secret, are each verified on their own
//! route (real HMAC); a delivery signed with the other app's secret, or
//! with the source's, is the sender's fault (401) and publishes nothing;
//! `crewlet doctor` names a seat route without a secret of its own, and
//! `crewlet agents` shows each seat's identities.

use crate::common;

use std::path::Path;

use common::*;
use crewlet_testkit::NatsServer;
use serde_json::Value;

const SOURCE_SECRET: &str = "the-source-app-secret";
const ADA_SECRET: &str = "ada-own-app-secret";
const LINUS_SECRET: &str = "linus-own-app-secret";

/// The example company with ada and linus each their own Slack app:
/// identities, and (where `own_secrets`) a signing secret each.
fn company(own_secrets: bool) -> String {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/company.toml"),
    )
    .expect("examples/company.toml");
    let secret = |name: &str| {
        if own_secrets {
            format!(", signing_secrets = {{ slack = \"${{{name}}}\" }}")
        } else {
            String::new()
        }
    };
    let doc = example
        .replace(
            "ada = { role = \"engineer\" }",
            &format!(
                "ada = {{ role = \"engineer\", identities = {{ slack = \"U04ADA\" }}{} }}",
                secret("ADA_SLACK_SIGNING_SECRET")
            ),
        )
        .replace(
            "linus = { role = \"engineer\" }",
            &format!(
                "linus = {{ role = \"engineer\", identities = {{ slack = \"U05LINUS\" }}{} }}",
                secret("LINUS_SLACK_SIGNING_SECRET")
            ),
        );
    assert_ne!(
        doc, example,
        "the example's seats are where this test expects"
    );
    doc
}

fn mention(node: &Node, secret: &str, handle: &str, event_id: &str) -> u16 {
    post_slack_mention(
        &node.api,
        secret,
        handle,
        event_id,
        "C123ABC456",
        "1515449522.000016",
        "can you look at the build?",
    )
    .expect("POST webhook")
    .status
}

fn delivery_ids(events: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = events
        .iter()
        .map(|e| {
            e["payload"]["delivery_id"]
                .as_str()
                .unwrap_or("?")
                .to_owned()
        })
        .collect();
    ids.sort();
    ids
}

#[test]
fn two_seats_slack_apps_are_each_verified_with_their_own_secret() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let doc = sb.path("company.toml");
    std::fs::write(&doc, company(true)).unwrap();
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins");
    let node = seatless_node(
        &sb,
        "signing-1",
        &server.url(),
        &plugins,
        &doc,
        &[
            ("SLACK_SIGNING_SECRET", SOURCE_SECRET),
            ("GITHUB_WEBHOOK_SECRET", SOURCE_SECRET),
            ("ADA_SLACK_SIGNING_SECRET", ADA_SECRET),
            ("LINUS_SLACK_SIGNING_SECRET", LINUS_SECRET),
        ],
    );

    // Each app's delivery on its own seat's route: verified.
    assert_eq!(mention(&node, ADA_SECRET, "ada", "Ev-ada"), 202);
    assert_eq!(mention(&node, LINUS_SECRET, "linus", "Ev-linus"), 202);
    // Signed with the other app's secret, or the source's: the sender's
    // fault, refused before anything is claimed or published.
    assert_eq!(mention(&node, ADA_SECRET, "linus", "Ev-forged"), 401);
    assert_eq!(mention(&node, SOURCE_SECRET, "ada", "Ev-source"), 401);
    // A seat without a secret of its own falls back to the source's.
    assert_eq!(mention(&node, SOURCE_SECRET, "grace", "Ev-grace"), 202);
    assert_eq!(mention(&node, ADA_SECRET, "grace", "Ev-grace-forged"), 401);

    let woke = wait_events(&node, "wake_published", 3);
    assert_eq!(delivery_ids(&woke), ["Ev-ada", "Ev-grace", "Ev-linus"]);
    let received = wait_events(&node, "webhook_received", 3);
    assert_eq!(
        delivery_ids(&received),
        ["Ev-ada", "Ev-grace", "Ev-linus"],
        "nothing refused is recorded as received"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    for (handle, delivery) in [
        ("ada", "Ev-ada"),
        ("linus", "Ev-linus"),
        ("grace", "Ev-grace"),
    ] {
        let mut got = Vec::new();
        while let Some(w) = rt.block_on(take_wake(&client, handle)) {
            got.push(w["delivery_id"].as_str().unwrap_or("?").to_owned());
        }
        assert_eq!(got, [delivery], "{handle}'s mailbox");
    }

    // `crewlet agents` names each seat's identities.
    let api = format!("http://{}", node.api);
    let (status, out) = run_to_exit(&["agents", "--api", &api], &[]);
    assert!(status.success(), "{out}");
    assert!(
        out.lines().next().unwrap_or("").contains("IDENTITIES"),
        "{out}"
    );
    let row = |h: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{h} ")))
            .unwrap_or_else(|| panic!("no row for {h}: {out}"))
            .to_owned()
    };
    assert!(row("ada").ends_with("slack:U04ADA"), "{out}");
    assert!(row("linus").ends_with("slack:U05LINUS"), "{out}");
    assert!(row("grace").trim_end().ends_with(" -"), "{out}");
}

#[test]
fn doctor_names_a_seat_slack_route_without_a_secret_of_its_own() {
    let sb = Sandbox::new();
    let port = crewlet_testkit::free_port();
    let config = format!("[api]\nport = {port}\n");
    let (_, findings) = crate::doctor::doctor(&sb, &config, &company(false), &[]);
    for (handle, id) in [("ada", "U04ADA"), ("linus", "U05LINUS")] {
        let f = crate::doctor::finding(
            &findings,
            "seat route",
            &format!("/webhooks/slack/{handle}"),
        );
        assert_eq!(f["verdict"], "warn", "{f}");
        let detail = f["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("SLACK_SIGNING_SECRET"), "{f} ({id})");
        let fix = f["fix"].as_str().unwrap_or_default();
        assert!(
            fix.contains(&format!("[seats.{handle}] signing_secrets")),
            "{f}"
        );
    }
    let (_, findings) = crate::doctor::doctor(&sb, &config, &company(true), &[]);
    let f = crate::doctor::finding(&findings, "seat route", "/webhooks/slack/ada");
    assert_eq!(f["verdict"], "ok", "{f}");
    assert!(
        f["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("ADA_SLACK_SIGNING_SECRET"),
        "{f}"
    );
}
