//! A refused delivery, recorded by the node (`[ingress] record_refused`)
//! and replayed offline with `crewlet plugins try`: the operator who set
//! the wrong signing secret sees the same refusal, then the delivery
//! accepted once the secret is right — without the sender.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::common::company::{SCRIPTED_COMPANY, SLACK_SECRET};
use crate::common::{self, eventually};
use crate::turns;

const WRONG: &str = "an-operators-wrong-secret";

fn try_capture(plugins: &str, file: &str, secret: &str) -> (i32, Value) {
    let (status, out) = common::run_to_exit(
        &[
            "plugins",
            "try",
            "slack",
            "--request",
            file,
            plugins,
            "--json",
        ],
        &[("SLACK_SIGNING_SECRET", secret)],
    );
    let start = out.find('{').unwrap_or_else(|| panic!("no JSON: {out}"));
    let v: Value =
        serde_json::from_str(out[start..].trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    (status.code().unwrap(), v)
}

#[test]
fn a_refused_delivery_is_recorded_and_replays_once_the_secret_is_right() {
    let w = turns::start_with(
        SCRIPTED_COMPANY,
        None,
        &[("SLACK_SIGNING_SECRET", WRONG)],
        "[ingress]\nrecord_refused = 5\n",
    );
    let body = serde_json::json!({
        "type": "event_callback",
        "event_id": "EvReplay1",
        "team_id": "T1",
        "event": {"type": "app_mention", "user": "U1", "text": "<@ada> hi", "channel": "C1", "ts": "1.1"},
    })
    .to_string();
    let (now, sig) = crewlet_ingress::sign::slack_headers(SLACK_SECRET.as_bytes(), body.as_bytes());
    let r = crewlet_testkit::http::post(
        &w.node.api,
        "/webhooks/slack/ada",
        &[
            ("Content-Type", "application/json"),
            ("X-Slack-Request-Timestamp", &now),
            ("X-Slack-Signature", &sig),
        ],
        body.as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 401, "{}", r.text());

    let dir = w.sb.data_dir().join("refused");
    let mut files: Vec<PathBuf> = Vec::new();
    assert!(
        eventually(Duration::from_secs(10), || {
            // Records are `*.json`; one being written is hidden until whole.
            files = std::fs::read_dir(&dir)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "json"))
                        .collect()
                })
                .unwrap_or_default();
            !files.is_empty()
        }),
        "nothing recorded in {}",
        dir.display()
    );
    assert_eq!(files.len(), 1, "{files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    assert!(
        !text.contains(WRONG),
        "the node's secret is never recorded: {text}"
    );
    let capture: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(capture["route"], "/webhooks/slack/ada");
    assert!(
        capture["refused"]
            .as_str()
            .unwrap()
            .contains("not verified"),
        "{capture}"
    );
    assert!(
        capture["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "x-slack-signature" && h[1] == sig.as_str()),
        "{capture}"
    );
    assert!(
        capture["headers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h[0] != "authorization"),
        "the test client's bearer token is a credential: {capture}"
    );

    let plugins = w.sb.path("plugins");
    let (plugins, file) = (plugins.to_str().unwrap(), files[0].to_str().unwrap());
    // The node's (wrong) secret: the same refusal, parse never run.
    let (code, v) = try_capture(plugins, file, WRONG);
    assert_eq!(code, 1, "{v:#}");
    assert!(
        v["verify"]["refused"]
            .as_str()
            .unwrap()
            .contains("does not match"),
        "{v:#}"
    );
    assert_eq!(v["parse"], Value::Null);
    // The sender's secret: accepted, the delivery as the node would claim it.
    let (code, v) = try_capture(plugins, file, SLACK_SECRET);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["verify"], "ok");
    assert_eq!(v["bounds"], "ok");
    let deliveries = v["parse"]["deliveries"].as_array().unwrap();
    assert_eq!(deliveries.len(), 1, "{v:#}");
    assert_eq!(deliveries[0]["delivery_id"], "EvReplay1");
    assert_eq!(deliveries[0]["source"], "slack");

    // A request file that is not a capture is the caller's error (2).
    let junk = w.sb.path("junk.json");
    std::fs::write(&junk, "{}").unwrap();
    let (status, out) = common::run_to_exit(
        &[
            "plugins",
            "try",
            "slack",
            "--request",
            junk.to_str().unwrap(),
            plugins,
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("captured request"), "{out}");
}
