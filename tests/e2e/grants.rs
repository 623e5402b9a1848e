//! Operator grants through the real binary: the OpenAI plugin exactly as
//! shipped (its manifest says api.openai.com) is pointed by the node's
//! configuration at a local server speaking OpenAI's wire protocol, and a
//! turn completes there; `GET /plugins` and `plugins list --config` say
//! which permissions the operator added. Without the grant the same turn
//! fails and its failure names the host it tried; a grant naming a plugin
//! the dirs do not hold, or a URL that is not one, stops the start with
//! the key's path.

use std::time::Duration;

use serde_json::Value;

use crate::common::{self, Sandbox};
use crate::turns::{self, KEYS, OPENAI_COMPANY, outcomes, post, submit, verdict};
use crewlet_testkit::{PluginsDir, ScriptedOpenAi};

/// Slack and the OpenAI plugin as shipped, unedited.
fn shipped(sb: &Sandbox) {
    PluginsDir::new(sb.path("plugins"))
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("openai", "plugins/providers/openai/plugin.toml");
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
    let openai = view["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "openai")
        .cloned()
        .unwrap_or(Value::Null);
    let lines: Vec<&str> = openai["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
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
