//! `crewlet plugins try` for the two kinds a captured delivery does not
//! cover: a provider makes one real call (here to a local server speaking
//! OpenAI's wire protocol, through the manifest's base URL and outbound
//! grant, with the key from the environment), and a module runs one tool
//! call and one event on state of its own. Exit statuses are the
//! contract: 0 answered, 1 refused, 2 the request is wrong.

use serde_json::{Value, json};

use crate::common::{self, Sandbox};
use crewlet_testkit::{PluginsDir, Reply, ScriptedOpenAi};

const KEY: &str = "sk-try-0123456789";

/// Runs `plugins try NAME --request FILE DIR --json` with `env`; answers
/// the status and the JSON printed (Null when none was).
fn try_it(
    sb: &Sandbox,
    dir: &str,
    name: &str,
    request: &Value,
    env: &[(&str, &str)],
) -> (i32, Value, String) {
    let file = sb.path(&format!("{name}-request.json"));
    std::fs::write(&file, request.to_string()).unwrap();
    let (status, out) = common::run_to_exit(
        &[
            "plugins",
            "try",
            name,
            "--request",
            &file.display().to_string(),
            dir,
            "--json",
        ],
        env,
    );
    let v = out
        .find('{')
        .and_then(|at| serde_json::from_str(out[at..].trim()).ok())
        .unwrap_or(Value::Null);
    (status.code().unwrap(), v, out)
}

/// A plugins dir whose `openai` calls a local server speaking its wire
/// protocol.
fn openai_at_a_local_vendor(sb: &Sandbox) -> (ScriptedOpenAi, PluginsDir) {
    let vendor = ScriptedOpenAi::start();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins.add_provider_at(
        "openai",
        "plugins/providers/openai/plugin.toml",
        &vendor.base_url(),
        &vendor.origin(),
    );
    (vendor, plugins)
}

#[test]
fn a_provider_makes_one_call_through_its_grant_with_the_key_from_the_environment() {
    let sb = Sandbox::new();
    let (vendor, plugins) = openai_at_a_local_vendor(&sb);
    let dir = plugins.path().display().to_string();
    let ask = json!({
        "model": "gpt-try",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "max_tokens": 64,
        "api_key_env": "TRY_OPENAI_KEY",
    });

    vendor.reply("gpt-try", Reply::Text("hello from the vendor".into()));
    let (status, v, out) = try_it(&sb, &dir, "openai", &ask, &[("TRY_OPENAI_KEY", KEY)]);
    assert_eq!(status, 0, "{out}");
    assert_eq!(v["completion"]["text"], "hello from the vendor", "{out}");
    assert_eq!(v["refused"], Value::Null);
    let seen = vendor.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].bearer.as_deref(),
        Some(KEY),
        "the key from the environment"
    );
    assert_eq!(seen[0].messages[1]["content"], "hi");
    assert!(!out.contains(KEY), "the key is never printed: {out}");

    // The vendor refuses the key: a classified failure, exit 1.
    vendor.reply("gpt-try", Reply::error(401, "Incorrect API key provided"));
    let (status, v, out) = try_it(&sb, &dir, "openai", &ask, &[("TRY_OPENAI_KEY", KEY)]);
    assert_eq!(status, 1, "{out}");
    assert_eq!(v["refused"]["kind"], "auth", "{out}");
    assert_eq!(v["refused"]["status"], 401, "{out}");

    // The named variable is not set: the request is wrong, nothing is sent.
    let (status, _, out) = try_it(&sb, &dir, "openai", &ask, &[]);
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("TRY_OPENAI_KEY, which is not set"), "{out}");
    let (status, _, out) = try_it(
        &sb,
        &dir,
        "openai",
        &json!({"model": "m", "messages": [{"role": "robot", "content": "x"}]}),
        &[],
    );
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("messages[0].role"), "{out}");
    assert_eq!(vendor.request_count(), 2, "no call for a wrong request");
}

/// A request with `input` is an embedding (WIT 0.4.2): the OpenAI plugin
/// posts the batch to `/v1/embeddings` with the key from the environment,
/// and the scripted provider answers its bag of words without a vendor.
/// (Until recall calls the node's embedder, this is the binary's one path
/// that runs a provider's `embed`.)
#[test]
fn an_embedding_request_embeds_through_the_provider() {
    let sb = Sandbox::new();
    let (vendor, plugins) = openai_at_a_local_vendor(&sb);
    plugins.add_with_deadline("scripted", "plugins/providers/scripted/plugin.toml", 10_000);
    let dir = plugins.path().display().to_string();
    let ask = json!({
        "model": "text-emb",
        "input": ["deploy the billing service", "lunch"],
        "api_key_env": "TRY_OPENAI_KEY",
    });
    vendor.reply(
        "text-emb",
        Reply::Vectors(vec![vec![0.5, 0.5], vec![1.0, 0.0]]),
    );
    let (status, v, out) = try_it(&sb, &dir, "openai", &ask, &[("TRY_OPENAI_KEY", KEY)]);
    assert_eq!(status, 0, "{out}");
    assert_eq!(
        v["embedded"]["vectors"],
        json!([[0.5, 0.5], [1.0, 0.0]]),
        "{out}"
    );
    let seen = vendor.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/embeddings");
    assert_eq!(seen[0].bearer.as_deref(), Some(KEY));
    assert_eq!(
        seen[0].body["input"],
        json!(["deploy the billing service", "lunch"])
    );
    assert!(!out.contains(KEY), "the key is never printed: {out}");

    let ask = json!({"model": "bag-of-words", "input": ["Deploy the billing service", "deploy THE billing service"]});
    let (status, v, out) = try_it(&sb, &dir, "scripted", &ask, &[]);
    assert_eq!(status, 0, "{out}");
    assert_eq!(v["embedded"]["dimensions"], 256, "{out}");
    let vectors = v["embedded"]["vectors"].as_array().unwrap();
    assert_eq!(vectors[0], vectors[1], "case does not matter: {out}");

    // Not a real model: another name is refused, exit 1.
    let ask = json!({"model": "text-embedding-3-small", "input": ["x"]});
    let (status, v, out) = try_it(&sb, &dir, "scripted", &ask, &[]);
    assert_eq!(status, 1, "{out}");
    assert_eq!(v["refused"]["kind"], "unsupported", "{out}");
}

#[test]
fn a_module_runs_one_tool_call_and_one_event_on_state_of_its_own() {
    let sb = Sandbox::new();
    let plugins = PluginsDir::new(sb.path("plugins"));
    plugins.add("notebook", "plugins/modules/notebook/plugin.toml");
    let dir = plugins.path().display().to_string();

    let write = json!({"tool": {
        "name": "write",
        "arguments": {"title": "Release plan", "text": "ship friday"},
        "seat": "ada",
    }});
    let (status, v, out) = try_it(&sb, &dir, "notebook", &write, &[]);
    assert_eq!(status, 0, "{out}");
    let state = v["state"].as_array().unwrap();
    let note = state
        .iter()
        .find(|s| s["bucket"] == "notes")
        .unwrap_or_else(|| panic!("the note is in its bucket: {out}"));
    assert!(
        note["value"].as_str().unwrap().contains("ship friday"),
        "{out}"
    );
    let published = v["published"].as_array().unwrap();
    assert_eq!(published.len(), 1, "{out}");
    assert_eq!(published[0]["kind"], "module.notebook.changed", "{out}");

    let ended = json!({"event": {"kind": "turn_ended", "payload": {
        "seat": "bob", "payload": {"turn_id": "t-9", "outcome": "delivered"},
    }}});
    let (status, v, out) = try_it(&sb, &dir, "notebook", &ended, &[]);
    assert_eq!(status, 0, "{out}");
    assert!(
        v["state"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["bucket"] == "worked"),
        "the ended turn is kept per seat: {out}"
    );

    // Arguments its schema refuses: the host's refusal, exit 1, nothing run.
    let bad = json!({"tool": {"name": "write", "arguments": {"title": ""}}});
    let (status, v, out) = try_it(&sb, &dir, "notebook", &bad, &[]);
    assert_eq!(status, 1, "{out}");
    assert!(v["refused"].as_str().unwrap().contains("schema"), "{out}");
    assert_eq!(v["state"], json!([]), "{out}");
    // Neither an event nor a tool call.
    let (status, _, out) = try_it(&sb, &dir, "notebook", &json!({"poke": {}}), &[]);
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("expected one event"), "{out}");
}
