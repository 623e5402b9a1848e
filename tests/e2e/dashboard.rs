//! The dashboard in a real browser: headless Chromium (Debian's) driven by
//! playwright-core, against the real binary.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use crewlet_testkit::{NatsServer, free_port};

const SECRET: &str = "dashboard-secret";
/// The Slack signing secret the example company's nodes verify with.
pub(crate) const SLACK_SECRET: &str = "dashboard-slack-secret";

/// A node on `server`; with `company`, the example company and plugins.
/// The nodes of one server share a keyring, as a fleet's nodes must: the
/// example's seats answer in the company chat with a credential minted
/// from its sealed signing secret, which a node with another keyring
/// cannot open.
pub(crate) fn node_on(server: &NatsServer, id: &str, company: bool) -> (Sandbox, Node) {
    let sb = Sandbox::new();
    let port = free_port();
    let keyring = server.spec().store_dir.join("fleet-keyring");
    let cfg = sb.config(
        port,
        &format!(
            "[node]\nid = \"{id}\"\n[stream]\nurl = \"{}\"\n[secrets]\nkeyring = {keyring:?}\n",
            server.url()
        ),
    );
    let mut builder = NodeBuilder::new(&sb, port)
        .arg("--config")
        .arg(&cfg)
        .arg("--data-dir")
        .arg(sb.data_dir());
    if company {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        builder = builder
            .arg("--company")
            .arg(root.join("examples/company.toml"))
            .arg("--plugins")
            .arg(root.join("plugins"))
            .env("GITHUB_WEBHOOK_SECRET", SECRET)
            .env("SLACK_SIGNING_SECRET", SLACK_SECRET);
    }
    let mut node = builder.spawn();
    node.wait_ready(Duration::from_secs(30));
    (sb, node)
}

/// Waits up to 30 s until `node` sees a fleet of two nodes holding the
/// example company's three seats.
pub(crate) fn wait_two_nodes_holding_every_seat(node: &Node) {
    assert!(
        eventually(Duration::from_secs(30), || {
            let fleet = node.get("/fleet").map(|r| r.json()).unwrap_or_default();
            let seats = node.get("/agents").map(|r| r.json()).unwrap_or_default();
            fleet["nodes"].as_array().is_some_and(|n| n.len() == 2)
                && seats["agents"]
                    .as_array()
                    .is_some_and(|s| s.len() == 3 && s.iter().all(|s| s["state"] == "held"))
        }),
        "two nodes and every seat held: {}",
        node.log_text()
    );
}

/// A read-scope token named `name`, made on `node` with the test's admin token.
pub(crate) fn read_token(node: &Node, name: &str) -> String {
    let body = format!(r#"{{"scope":"read","name":"{name}"}}"#);
    let made = http::request(
        &node.api,
        "POST",
        "/tokens",
        &[("content-type", "application/json")],
        body.as_bytes(),
    )
    .expect("POST /tokens");
    assert_eq!(made.status, 201, "{}", made.text());
    made.json()["token"].as_str().unwrap().to_owned()
}

/// `tests/browser`, where the browser scripts run; playwright-core installed.
pub(crate) fn browser_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `./dev test` (scripts/bootstrap.sh --browser installs it)"
    );
    dir
}

#[test]
fn the_dashboard_shows_the_org_and_a_live_feed_in_a_real_browser() {
    let browser_dir = browser_dir();
    let server = NatsServer::start();
    let (_sa, node_a) = node_on(&server, "dash-a", true);
    let page = node_a.get("/").expect("dashboard served");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("/assets/app.js"));

    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let mut driver = Command::new("node")
        .arg(browser_dir.join("dashboard.mjs"))
        // The first-start URL's shape: the token in the fragment logs in.
        .arg(format!(
            "http://{}/#token={}",
            node_a.api,
            common::http::OPERATOR_TOKEN
        ))
        .arg("dash-b")
        .arg(&screenshot)
        .current_dir(&browser_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run node (Node.js)");
    let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
    let first = lines.next().expect("driver output").unwrap();
    assert_eq!(first, "READY");

    // A peer publishes, and a signed webhook arrives at node A; the page on
    // node A must show both live.
    let (_sb, _node_b) = node_on(&server, "dash-b", false);
    let body = br#"{"action":"created","issue":{"number":1},"comment":{"body":"hi @ada"}}"#;
    let sig = crewlet_ingress::sign::github_signature(SECRET.as_bytes(), body);
    let accepted = http::post(
        &node_a.api,
        "/webhooks/github",
        &[
            ("Content-Type", "application/json"),
            ("X-GitHub-Event", "issue_comment"),
            ("X-GitHub-Delivery", "dash-1"),
            ("X-Hub-Signature-256", &sig),
        ],
        body,
    )
    .expect("webhook answered");
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let last = lines.next().expect("driver output").unwrap();
    assert_eq!(last, "OK");
    assert!(driver.wait().unwrap().success());
    assert!(screenshot.is_file());
}
