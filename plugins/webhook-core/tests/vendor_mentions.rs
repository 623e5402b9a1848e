//! Each vendor's mention syntax, normalised to the ids the vendor sends,
//! on payloads shaped as each vendor delivers them (`testdata/`, after the
//! vendors' documented examples); and the same payloads with the mention
//! mangled or cut short: parsed, addressed to nobody, never an error.

use crewlet_webhook_core::{Input, Parsed, atlassian, github, gitlab, slack};
use serde_json::Value;

fn payload(name: &str) -> Value {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

/// The payload with the string at `path` replaced.
fn with_text(mut v: Value, path: &[&str], text: &str) -> Vec<u8> {
    let mut at = &mut v;
    for key in path {
        at = &mut at[*key];
    }
    *at = Value::String(text.into());
    serde_json::to_vec(&v).unwrap()
}

fn parse(
    parse: fn(&Input<'_>) -> Result<Parsed, crewlet_webhook_core::ParseError>,
    route: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<String> {
    let input = Input {
        route,
        headers,
        body,
        secrets: &[],
        now_unix_seconds: 0,
    };
    let parsed = parse(&input).unwrap_or_else(|e| panic!("{route}: {e:?}"));
    assert_eq!(parsed.deliveries.len(), 1, "{route}");
    parsed.deliveries[0].addressed.mentions.clone()
}

fn slack_mentions(body: &[u8]) -> Vec<String> {
    parse(slack::parse, "/webhooks/slack", &[], body)
}

#[test]
fn slack_app_mention_yields_user_ids_with_and_without_a_label() {
    let v = payload("slack_app_mention.json");
    let body = serde_json::to_vec(&v).unwrap();
    assert_eq!(slack_mentions(&body), ["U04ABCDEF", "U07GRACE1"]);
    for mangled in [
        "<@U04ABCDEF can you look",
        "<@U04ABCDEF|ada can you look",
        "<@U04AB CDEF> can you look",
        "<@>",
        "<@U04ABCDEF",
    ] {
        let body = with_text(v.clone(), &["event", "text"], mangled);
        assert_eq!(slack_mentions(&body), Vec::<String>::new(), "{mangled:?}");
    }
}

#[test]
fn jira_comment_yields_account_ids() {
    let v = payload("jira_comment_created.json");
    let headers = [("x-atlassian-webhook-identifier", "a1b2")];
    let jira = |body: &[u8]| parse(atlassian::parse, "/webhooks/jira", &headers, body);
    assert_eq!(
        jira(&serde_json::to_vec(&v).unwrap()),
        ["5b10ac8d82e05b22cc7d4ef5"]
    );
    for mangled in [
        "[~accountid:5b10ac8d82e05b22cc7d4ef5 the nightly fails",
        "[~accountid:]",
        "[~accountid:5b10 ac8d] hi",
        "[~accountid:5b10ac8d",
        "[~ada]",
    ] {
        let body = with_text(v.clone(), &["comment", "body"], mangled);
        assert_eq!(jira(&body), Vec::<String>::new(), "{mangled:?}");
    }
}

#[test]
fn confluence_comment_yields_account_ids_from_storage_format() {
    let v = payload("confluence_comment_created.json");
    let headers = [("x-atlassian-webhook-identifier", "c3d4")];
    let confluence = |body: &[u8]| parse(atlassian::parse, "/webhooks/confluence", &headers, body);
    assert_eq!(
        confluence(&serde_json::to_vec(&v).unwrap()),
        ["5b10ac8d82e05b22cc7d4ef5"]
    );
    let path = ["comment", "body", "storage", "value"];
    for mangled in [
        "<ri:user ri:account-id=\"5b10ac8d82e05b22cc7d4ef5",
        "<ri:user ri:account-id=\"\" />",
        "<ri:user ri:account-id=\"5b10 ac8d\" />",
    ] {
        let body = with_text(v.clone(), &path, mangled);
        assert_eq!(confluence(&body), Vec::<String>::new(), "{mangled:?}");
    }
}

#[test]
fn github_comment_yields_logins_as_written() {
    let v = payload("github_issue_comment.json");
    let headers = [
        ("x-github-event", "issue_comment"),
        ("x-github-delivery", "g1"),
    ];
    let gh = |body: &[u8]| parse(github::parse, "/webhooks/github", &headers, body);
    // As GitHub sent it; logins fold when resolved, not here.
    assert_eq!(
        gh(&serde_json::to_vec(&v).unwrap()),
        ["Acme-Ada-Bot", "octo-org"]
    );
    for mangled in ["@", "mail ada@acme-ada-bot.example", "@ @ @"] {
        let body = with_text(v.clone(), &["comment", "body"], mangled);
        assert_eq!(gh(&body), Vec::<String>::new(), "{mangled:?}");
    }
}

#[test]
fn gitlab_note_yields_usernames() {
    let v = payload("gitlab_note.json");
    let headers = [
        ("x-gitlab-event", "Note Hook"),
        ("x-gitlab-event-uuid", "u1"),
    ];
    let gl = |body: &[u8]| parse(gitlab::parse, "/webhooks/gitlab", &headers, body);
    assert_eq!(gl(&serde_json::to_vec(&v).unwrap()), ["ada-bot", "root"]);
    let body = with_text(v, &["object_attributes", "note"], "@");
    assert_eq!(gl(&body), Vec::<String>::new());
}
