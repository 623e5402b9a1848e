//! Every dashboard view in a real browser (tests/browser/views.mjs) against
//! a live two-node fleet running the example company: the views show real
//! data at both widths, pausing a seat from its page holds its wakes until
//! it is resumed there, a read-scope session cannot write, and an expired
//! token lands on the login. Screenshots go under the test's output dir.

use crate::common;
use crate::dashboard::{SLACK_SECRET, node_on};

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use crewlet_testkit::NatsServer;
use serde_json::Value;

fn agent(node: &Node, handle: &str) -> Value {
    let all = node.get("/agents").expect("GET /agents").json();
    all["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["handle"] == handle).cloned())
        .unwrap_or(Value::Null)
}

fn seat_events(node: &Node, kind: &str, seat: &str) -> Vec<Value> {
    events(node, kind)
        .into_iter()
        .filter(|e| e["seat"] == seat)
        .collect()
}

#[test]
fn every_view_shows_the_live_fleet_and_a_pause_from_the_page_holds_the_seats_wakes() {
    let browser_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        browser_dir.join("node_modules/playwright-core").is_dir(),
        "playwright-core is not installed: run `./dev test` (scripts/bootstrap.sh --browser installs it)"
    );
    let server = NatsServer::start();
    let (_sa, a) = node_on(&server, "views-a", true);
    let (_sb, _b) = node_on(&server, "views-b", true);
    assert!(
        eventually(Duration::from_secs(30), || {
            let fleet = a.get("/fleet").map(|r| r.json()).unwrap_or_default();
            let seats = a.get("/agents").map(|r| r.json()).unwrap_or_default();
            fleet["nodes"].as_array().is_some_and(|n| n.len() == 2)
                && seats["agents"]
                    .as_array()
                    .is_some_and(|s| s.len() == 3 && s.iter().all(|s| s["state"] == "held"))
        }),
        "two nodes and every seat held: {}",
        a.log_text()
    );
    // A real turn for the views to show.
    slack_mention(
        &a,
        SLACK_SECRET,
        "grace",
        "EvViews1",
        "C9",
        "9.1",
        "<@grace> hi",
    );
    assert!(
        eventually(Duration::from_secs(30), || !seat_events(
            &a,
            "turn_ended",
            "grace"
        )
        .is_empty()),
        "grace's turn: {}",
        a.log_text()
    );
    let made = http::request(
        &a.api,
        "POST",
        "/tokens",
        &[("content-type", "application/json")],
        br#"{"scope":"read","name":"viewer"}"#,
    )
    .expect("POST /tokens");
    assert_eq!(made.status, 201, "{}", made.text());
    let read_token = made.json()["token"].as_str().unwrap().to_owned();

    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-views");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let mut driver = Command::new("node")
        .arg(browser_dir.join("views.mjs"))
        .arg(format!("http://{}", a.api))
        .arg(http::OPERATOR_TOKEN)
        .arg(&read_token)
        .arg(&out)
        .current_dir(&browser_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run node (Node.js)");
    let mut stdin = driver.stdin.take().unwrap();
    let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("driver output").unwrap();
    assert_eq!(next(), "PAUSED");

    // Paused from the page: ada's mention waits in her mailbox and starts
    // no turn, while linus (her role, the same fleet) answers his.
    assert_eq!(agent(&a, "ada")["paused"], true);
    slack_mention(
        &a,
        SLACK_SECRET,
        "ada",
        "EvViews2",
        "C9",
        "9.2",
        "<@ada> hi",
    );
    slack_mention(
        &a,
        SLACK_SECRET,
        "linus",
        "EvViews3",
        "C9",
        "9.3",
        "<@linus> hi",
    );
    assert!(
        eventually(Duration::from_secs(30), || {
            let m = &agent(&a, "ada")["mailbox"];
            m["pending"].as_u64().unwrap_or(0) + m["in_work"].as_u64().unwrap_or(0) >= 1
                && !seat_events(&a, "turn_ended", "linus").is_empty()
        }),
        "ada's wake held, linus answered: {} {}",
        agent(&a, "ada"),
        a.log_text()
    );
    assert!(seat_events(&a, "turn_started", "ada").is_empty());

    writeln!(stdin, "RESUME").unwrap();
    drop(stdin);
    assert_eq!(next(), "RESUMED");
    assert!(
        eventually(Duration::from_secs(30), || !seat_events(
            &a,
            "turn_ended",
            "ada"
        )
        .is_empty()),
        "ada's held wake runs once resumed: {}",
        a.log_text()
    );
    assert_eq!(next(), "OK");
    assert!(driver.wait().unwrap().success());
    // What the page did, as the API sees it: the revision, the secret, the token.
    let config = a.get("/config").expect("GET /config").json();
    assert!(
        config["document"]
            .as_str()
            .is_some_and(|d| d.contains("# edited from the dashboard")),
        "{config}"
    );
    let secrets = a.get("/secrets").expect("GET /secrets").json();
    assert!(
        !secrets.to_string().contains("DASH_SECRET"),
        "removed: {secrets}"
    );
    let bearer = format!("Bearer {read_token}");
    let refused =
        http::request(&a.api, "GET", "/org", &[("Authorization", &bearer)], b"").expect("GET /org");
    assert_eq!(refused.status, 401, "revoked: {}", refused.text());
    for view in [
        "org", "feed", "turn", "seat", "budgets", "fleet", "plugins", "bucket", "config",
        "secrets", "tokens",
    ] {
        for width in [1280, 390] {
            let shot = out.join(format!("{view}-{width}.png"));
            assert!(shot.is_file(), "{}", shot.display());
        }
    }
}
