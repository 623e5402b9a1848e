//! Identities through the real binary: mentions as Slack, Jira and GitHub
//! send them reach the seat that claims them on the shared route, once; a
//! mangled mention or an unclaimed id wakes nobody and is recorded as
//! unrouted with the ids it saw; an id claimed twice is refused naming both
//! claimants, through `PUT /config`, `crewlet config import` and at start.

use crate::common;

use std::path::Path;

use common::*;
use crewlet_ingress::sign::{github_signature, slack_headers};
use crewlet_testkit::{NatsServer, free_port, http};
use serde_json::{Value, json};

const SECRET: &str = "identities-secret";
const ADA_SLACK: &str = "U04ABCDEF";
const ADA_JIRA: &str = "5b10ac8d82e05b22cc7d4ef5";

/// The example company, its seats given identities, a person, and a Jira
/// integration.
fn company() -> String {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/company.toml"),
    )
    .expect("examples/company.toml");
    let doc = example
        .replace(
            "ada = { role = \"engineer\" }",
            &format!(
                "ada = {{ role = \"engineer\", identities = {{ slack = \"{ADA_SLACK}\", github = \"acme-ada-bot\", jira = \"{ADA_JIRA}\" }} }}"
            ),
        )
        .replace(
            "linus = { role = \"engineer\" }",
            "linus = { role = \"engineer\", identities = { slack = \"U05LINUS1\" } }",
        );
    assert_ne!(
        doc, example,
        "the example's seats are where this test expects"
    );
    format!(
        "{doc}\n[integrations.jira]\nplugin = \"atlassian\"\nsecret = \"JIRA_WEBHOOK_SECRET\"\n\n\
         [people.hopper]\nname = \"Grace Hopper\"\nidentities = {{ slack = \"U07HOPPER\" }}\n"
    )
}

fn node(sb: &Sandbox, server: &NatsServer, doc: &Path) -> Node {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins");
    let secrets = [
        "GITHUB_WEBHOOK_SECRET",
        "SLACK_SIGNING_SECRET",
        "JIRA_WEBHOOK_SECRET",
    ];
    let env: Vec<(&str, &str)> = secrets.iter().map(|name| (*name, SECRET)).collect();
    seatless_node(sb, "ids-1", &server.url(), &plugins, doc, &env)
}

fn accepted(node: &Node, r: std::io::Result<http::Response>) {
    assert_accepted(node, &r.expect("POST webhook"));
}

/// A Slack `app_mention` from a person, on the shared route.
fn slack(node: &Node, event_id: &str, text: &str) {
    let body = json!({
        "token": "ZZZZZZWSxiZZZ2yIvs3peJ", "team_id": "T061EG9R6", "api_app_id": "A0MDYCDME",
        "type": "event_callback", "event_id": event_id, "event_time": 1_515_449_522,
        "authorizations": [{"team_id": "T061EG9R6", "user_id": ADA_SLACK, "is_bot": true}],
        "event": {"type": "app_mention", "user": "U07HOPPER", "text": text,
                  "channel": "C123ABC456", "ts": "1515449522.000016"},
    })
    .to_string();
    let (now, sig) = slack_headers(SECRET.as_bytes(), body.as_bytes());
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Slack-Request-Timestamp", now.as_str()),
        ("X-Slack-Signature", sig.as_str()),
    ];
    accepted(
        node,
        http::post(&node.api, "/webhooks/slack", &headers, body.as_bytes()),
    );
}

/// A Jira `comment_created` whose body mentions `account`.
fn jira(node: &Node, delivery: &str, account: &str) {
    let body = json!({
        "timestamp": 1_733_482_800_123_i64, "webhookEvent": "comment_created",
        "comment": {"id": "10311", "body": format!("[~accountid:{account}] the nightly fails on ARM again"),
                    "author": {"accountId": "557058:f58131cb", "displayName": "Grace Hopper"}},
        "issue": {"id": "10042", "key": "OPS-42",
                  "fields": {"summary": "Nightly fails", "project": {"key": "OPS"}, "assignee": null}},
    })
    .to_string();
    let sig = github_signature(SECRET.as_bytes(), body.as_bytes());
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Atlassian-Webhook-Identifier", delivery),
        ("X-Hub-Signature", sig.as_str()),
    ];
    accepted(
        node,
        http::post(&node.api, "/webhooks/jira", &headers, body.as_bytes()),
    );
}

/// A GitHub `issue_comment` whose body is `text`.
fn github(node: &Node, delivery: &str, text: &str) {
    let body = json!({
        "action": "created",
        "issue": {"number": 42, "title": "Flaky build", "assignees": []},
        "comment": {"body": text, "user": {"login": "octocat"}},
        "repository": {"full_name": "acme/robot"},
        "sender": {"login": "octocat"},
    })
    .to_string();
    let sig = github_signature(SECRET.as_bytes(), body.as_bytes());
    let headers = [
        ("Content-Type", "application/json"),
        ("X-GitHub-Event", "issue_comment"),
        ("X-GitHub-Delivery", delivery),
        ("X-Hub-Signature-256", sig.as_str()),
    ];
    accepted(
        node,
        http::post(&node.api, "/webhooks/github", &headers, body.as_bytes()),
    );
}

/// Every wake waiting on `handle`'s mailbox, taken.
fn drain(rt: &tokio::runtime::Runtime, client: &async_nats::Client, handle: &str) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(w) = rt.block_on(take_wake(client, handle)) {
        out.push(w);
    }
    out
}

fn by_delivery<'a>(events: &'a [Value], delivery: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["payload"]["delivery_id"] == delivery)
        .collect()
}

#[test]
fn vendor_mentions_on_shared_routes_wake_the_claimed_seat_once() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let doc = sb.path("company.toml");
    std::fs::write(&doc, company()).unwrap();
    let node = node(&sb, &server, &doc);

    // The roster names each seat's identities, and the org its people.
    let org = node.get("/org").unwrap().json();
    let ada = org["seats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["handle"] == "ada")
        .unwrap();
    assert_eq!(ada["identities"]["slack"], json!([ADA_SLACK]), "{org}");
    assert_eq!(org["people"][0]["name"], "Grace Hopper", "{org}");
    assert_eq!(
        org["people"][0]["identities"]["slack"],
        json!(["U07HOPPER"])
    );

    slack(
        &node,
        "Ev-ada",
        &format!("<@{ADA_SLACK}|ada> can you look at the flaky build?"),
    );
    // A person is named too, and is not a seat: only linus is woken.
    slack(&node, "Ev-linus", "<@U05LINUS1> and <@U07HOPPER>, lunch?");
    jira(&node, "jira-1", ADA_JIRA);
    github(&node, "gh-1", "@Acme-Ada-Bot could you bisect this?");
    // Mangled and unclaimed: recorded, nobody woken.
    slack(&node, "Ev-cut", &format!("<@{ADA_SLACK} can you look"));
    slack(&node, "Ev-nobody", "<@U0NOBODY1> hello?");

    let woke = wait_events(&node, "wake_published", 4);
    let unrouted = wait_events(&node, "delivery_unrouted", 2);
    for (delivery, seat) in [
        ("Ev-ada", "ada"),
        ("Ev-linus", "linus"),
        ("jira-1", "ada"),
        ("gh-1", "ada"),
    ] {
        let wakes = by_delivery(&woke, delivery);
        assert_eq!(wakes.len(), 1, "{delivery} wakes once: {woke:?}");
        assert_eq!(wakes[0]["seat"], seat, "{delivery}: {}", wakes[0]);
        assert_eq!(wakes[0]["payload"]["reason"], "mention");
    }
    let cut = by_delivery(&unrouted, "Ev-cut");
    assert_eq!(cut.len(), 1, "{unrouted:?}");
    assert_eq!(cut[0]["payload"]["unclaimed"], json!([]), "{}", cut[0]);
    let nobody = by_delivery(&unrouted, "Ev-nobody");
    assert_eq!(nobody[0]["payload"]["unclaimed"], json!(["U0NOBODY1"]));
    let reason = nobody[0]["payload"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("no seat claims") && reason.contains("U0NOBODY1"),
        "{reason}"
    );
    let received = wait_events(&node, "webhook_received", 6);
    assert_eq!(received.len(), 6, "every delivery is recorded");

    // The mailboxes hold exactly those wakes.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async_nats::connect(server.url())).unwrap();
    let mut ada: Vec<String> = drain(&rt, &client, "ada")
        .iter()
        .map(|w| w["delivery_id"].as_str().unwrap().to_owned())
        .collect();
    ada.sort();
    assert_eq!(ada, ["Ev-ada", "gh-1", "jira-1"]);
    let linus = drain(&rt, &client, "linus");
    assert_eq!(linus.len(), 1, "{linus:?}");
    assert_eq!(linus[0]["delivery_id"], "Ev-linus");
    assert!(drain(&rt, &client, "grace").is_empty());
    assert_eq!(
        events(&node, "wake_published").len(),
        4,
        "no wake after the fact"
    );
}

#[test]
fn an_identity_claimed_by_two_seats_is_refused_naming_both() {
    let server = NatsServer::start();
    let sb = Sandbox::new();
    let good = sb.path("company.toml");
    std::fs::write(&good, company()).unwrap();
    let bad_text = company().replace(
        "identities = { slack = \"U05LINUS1\" }",
        &format!("identities = {{ slack = \"{ADA_SLACK}\" }}"),
    );
    let bad = sb.path("bad.toml");
    std::fs::write(&bad, &bad_text).unwrap();
    let names_both = |text: &str| {
        text.contains("seats.linus.identities.slack")
            && text.contains("`seats.ada`")
            && text.contains("`seats.linus`")
            && text.contains(ADA_SLACK)
    };

    // At start: the node refuses the document and exits.
    let cfg = sb.config(free_port(), "[node]\nid = \"ids-bad\"\n");
    let (status, out) = run_to_exit(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            sb.path("bad-data").to_str().unwrap(),
            "--company",
            bad.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!status.success(), "{out}");
    assert!(names_both(&out), "{out}");

    // Through a running node: `PUT /config` and `crewlet config import`.
    let node = node(&sb, &server, &good);
    let refused = http::request(&node.api, "PUT", "/config", &[], bad_text.as_bytes()).unwrap();
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(names_both(&refused.text()), "{}", refused.text());
    let api = format!("http://{}", node.api);
    let (status, out) = run_to_exit(
        &["config", "import", bad.to_str().unwrap(), "--api", &api],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(names_both(&out), "{out}");
    // Nothing changed: the node serves the document it started with.
    let org = node.get("/org").unwrap().json();
    let linus = &org["seats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["handle"] == "linus")
        .unwrap()["identities"];
    assert_eq!(linus["slack"], json!(["U05LINUS1"]), "{org}");
}
