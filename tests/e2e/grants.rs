//! Operator grants through the real binary: the OpenAI plugin exactly as
//! shipped (its manifest says api.openai.com) is pointed by the node's
//! configuration at a local server speaking OpenAI's wire protocol, and a
//! turn completes there; `GET /plugins` and `plugins list --config` say
//! which permissions the operator added. Without the grant the same turn
//! fails and its failure names the host it tried; a grant naming a plugin
//! the dirs do not hold, or a URL that is not one, stops the start with
//! the key's path. An operator's deny narrows what the manifest declares:
//! the call is refused before it leaves the node, naming the deny, and
//! `GET /plugins` and `plugins list --effective` say whose word it is.

use std::time::Duration;

use serde_json::Value;

use crate::common::{self, Sandbox};
use crate::turns::{self, KEYS, OPENAI_COMPANY, outcomes, post, submit, verdict};
use crewlet_testkit::http;
use crewlet_testkit::{PluginsDir, ScriptedOpenAi};

/// Slack and the OpenAI plugin as shipped, unedited.
fn shipped(sb: &Sandbox) {
    PluginsDir::new(sb.path("plugins"))
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("openai", "plugins/providers/openai/plugin.toml");
}

/// The row of `GET /plugins` for the plugin `name` (null when absent).
fn plugin(view: &Value, name: &str) -> Value {
    let mut plugins = view["plugins"].as_array().into_iter().flatten();
    plugins
        .find(|p| p["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The `permissions` lines of one plugin's row of `GET /plugins`.
fn permissions(plugin: &Value) -> Vec<&str> {
    let lines = plugin["permissions"].as_array().into_iter().flatten();
    lines.filter_map(Value::as_str).collect()
}

fn grant(ai: &ScriptedOpenAi) -> String {
    format!(
        "[plugins.grants.openai]\nbase_url = \"{}\"\n",
        ai.base_url()
    )
}

#[test]
fn a_granted_base_url_serves_the_turn_and_is_shown_as_the_operators() {
    let ai = ScriptedOpenAi::start();
    let w = turns::start_custom(OPENAI_COMPANY, KEYS, &grant(&ai), shipped);
    ai.reply("exec-a", post("C1", "1.1", "Hi, from the proxy."));
    ai.reply("exec-a", submit("delivered"));
    ai.reply("review", verdict("done"));
    w.mention("ada", "EvG1", "C1", "1.1", "<@ada> hello?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["delivered"]);
    assert_eq!(
        ai.request_count(),
        3,
        "every call went to the granted server"
    );

    let view = w.node.get("/plugins").unwrap().json();
    let openai = plugin(&view, "openai");
    let lines = permissions(&openai);
    let config = w.sb.path("node.toml").display().to_string();
    let by_operator = format!("(operator grant in {config})");
    assert!(
        lines.contains(&format!("base URL {} {by_operator}", ai.base_url()).as_str()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&format!("outbound {} {by_operator}", ai.origin()).as_str()),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"outbound https://api.openai.com:443"),
        "the manifest's own host is the manifest's: {lines:?}"
    );

    let plugins = w.sb.path("plugins").display().to_string();
    let (status, out) =
        common::run_to_exit(&["plugins", "list", "--config", &config, &plugins], &[]);
    assert!(status.success(), "{out}");
    assert!(
        out.contains(&format!("base url: {} {by_operator}", ai.base_url())),
        "{out}"
    );
}

#[test]
fn without_the_grant_the_failure_names_the_host_it_tried() {
    // No network here: api.openai.com cannot be reached, as a node behind
    // a proxy it was not told of.
    let w = turns::start_custom(OPENAI_COMPANY, KEYS, "", shipped);
    w.mention("ada", "EvG2", "C1", "2.1", "<@ada> hello?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["llm_unavailable"]);
    let text = w.wait_events("llm_unavailable", 1)[0].to_string();
    assert!(
        text.contains("calling https://api.openai.com:443"),
        "{text}"
    );
}

#[test]
fn a_wrong_grant_stops_the_start_with_its_key() {
    let cases = [
        (
            "[plugins.grants.opnai]\nbase_url = \"http://127.0.0.1:9/v1\"\n",
            "`plugins.grants.opnai`: no plugin of that name",
        ),
        (
            "[plugins.grants.openai]\nbase_url = \"127.0.0.1:9/v1\"\n",
            "`plugins.grants.openai.base_url`: `127.0.0.1:9/v1` is not scheme://host:port",
        ),
        (
            "[plugins.grants.slack]\nbase_url = \"http://127.0.0.1:9/v1\"\n",
            "`plugins.grants.slack.base_url`: only a provider plugin takes it",
        ),
        (
            "[plugins.grants.openai]\n",
            "key `plugins.grants.openai`: grants nothing",
        ),
    ];
    for (extra, says) in cases {
        let sb = Sandbox::new();
        shipped(&sb);
        let mut node = sb
            .node(extra)
            .arg("--plugins")
            .arg(sb.path("plugins"))
            .spawn();
        let status = node.wait_exit(Duration::from_secs(30));
        assert_eq!(status.code(), Some(2), "{}", node.log_text());
        assert!(
            node.log_text().contains(says),
            "{says}: {}",
            node.log_text()
        );
    }
}

/// The provider's manifest declares the local server as its one host; the
/// operator denies it. Every model call of the turn is refused before a
/// request leaves the node (the server sees none), the turn's failure
/// names the key that denies it, and the node (`GET /plugins`, `plugins
/// list --effective --api`) and the file (`plugins list --effective
/// --config`) both list the host as the operator's deny.
#[test]
fn a_host_the_manifest_declares_and_the_operator_denies_is_refused_naming_the_deny() {
    let ai = ScriptedOpenAi::start();
    let deny = format!(
        "[plugins.grants.openai]\ndenied_outbound_hosts = [\"{}\"]\n\
         [plugins.grants.atlassian]\ndenied_routes = [\"/webhooks/confluence\"]\n",
        ai.origin()
    );
    let w = turns::start_custom(OPENAI_COMPANY, KEYS, &deny, |sb| {
        turns::plugins(sb, Some(&ai));
        PluginsDir::new(sb.path("plugins"))
            .add("atlassian", "plugins/webhooks/atlassian/plugin.toml");
    });
    // A route the operator denies answers 404 as one nobody declared,
    // naming the deny; the plugin's other route still serves (and asks
    // for the integration this company does not have).
    let answer = |route: &str| {
        let json = [("Content-Type", "application/json")];
        let r = http::post(&w.node.api, route, &json, b"{}").unwrap();
        (r.status, r.text())
    };
    let (status, text) = answer("/webhooks/confluence");
    assert_eq!(status, 404, "{text}");
    assert!(
        text.contains("no webhook plugin serves /webhooks/confluence"),
        "{text}"
    );
    // ... naming the operator's key that took it away (not the file).
    assert!(
        text.contains("`plugins.grants.atlassian.denied_routes[0]`"),
        "{text}"
    );
    assert!(!text.contains(".toml"), "{text}");
    let (status, text) = answer("/webhooks/nothing-declares-this");
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("no webhook plugin serves"), "{text}");
    assert!(!text.contains("denies"), "nobody denied it: {text}");
    let (status, text) = answer("/webhooks/jira");
    assert_eq!(status, 404, "{text}");
    assert!(
        text.contains("no [integrations.jira]"),
        "jira is still served: {text}"
    );

    w.mention("ada", "EvG4", "C1", "4.1", "<@ada> hello?");
    w.wait_events("turn_ended", 1);
    assert_eq!(outcomes(&w), ["llm_unavailable"]);
    let key = "plugins.grants.openai.denied_outbound_hosts[0]";
    let config = w.sb.path("node.toml").display().to_string();
    let text = w.wait_events("llm_unavailable", 1)[0].to_string();
    assert!(
        text.contains(&format!(
            "outbound {} is denied by the operator: `{key}` in {config}",
            ai.origin()
        )),
        "{text}"
    );
    assert_eq!(ai.request_count(), 0, "no request left the node");

    let view = w.node.get("/plugins").unwrap().json();
    let openai = plugin(&view, "openai");
    let rows = openai["effective"].as_array().cloned().unwrap_or_default();
    let row = |permission: &str, value: &str| {
        rows.iter()
            .find(|r| r["permission"] == permission && r["value"] == value)
            .cloned()
            .unwrap_or_else(|| panic!("no {permission} {value} in {rows:?}"))
    };
    let denied = row("outbound", &ai.origin());
    assert_eq!(denied["from"], "operator_denied", "{denied}");
    assert_eq!(denied["key"], key, "{denied}");
    assert_eq!(denied["file"], config.as_str(), "{denied}");
    let base = row("base_url", &ai.base_url());
    assert_eq!(base["from"], "operator_denied", "{base}");
    let slack = plugin(&view, "slack");
    assert!(
        slack["effective"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["from"] == "manifest"),
        "nothing of slack's is the operator's: {slack}"
    );
    let lines = permissions(&openai);
    let marked = format!(
        "outbound {} (denied by the operator: `{key}` in {config})",
        ai.origin()
    );
    assert!(lines.contains(&marked.as_str()), "{lines:?}");

    let by = format!("operator denied (`{key}` in {config})");
    let api = format!("http://{}", w.node.api);
    let (status, live) =
        common::run_to_exit(&["plugins", "list", "--effective", "--api", &api], &[]);
    assert!(status.success(), "{live}");
    let plugins = w.sb.path("plugins").display().to_string();
    let (status, offline) = common::run_to_exit(
        &[
            "plugins",
            "list",
            "--effective",
            "--config",
            &config,
            &plugins,
        ],
        &[],
    );
    assert!(status.success(), "{offline}");
    for out in [&live, &offline] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("outbound {}", ai.origin())))
            .unwrap_or_else(|| panic!("no outbound line in:\n{out}"));
        assert!(line.ends_with(&by), "{line}");
        assert!(
            out.lines()
                .any(|l| l.contains("route /webhooks/slack") && l.ends_with("manifest")),
            "{out}"
        );
    }
}
