//! The model layer over the real openai guest against a real local server
//! speaking the chat-completions wire format: tool calls, key rotation on a
//! 429 with the bench shared through real NATS, chain fallback and
//! exhaustion, and the events each one publishes.

use crate::common;

use std::time::{Duration, SystemTime};

use common::{Host, Node, model, request, resolver, site};
use crewlet_company::ModelRef;
use crewlet_coord::{KeyHint, key_hint};
use crewlet_models::{CooldownPolicy, Failure, Models, ModelsOptions, Outcome};
use crewlet_testkit::{NatsServer, Reply, ScriptedOpenAi};
use crewlet_turns::{Brain, Msg, Unavailable};
use serde_json::json;

const KEY_1: &str = "live-key-0001-aaaaaaaaaaaa";
const KEY_2: &str = "live-key-0002-bbbbbbbbbbbb";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_round_trips_with_its_arguments() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = node
        .models(vec![host.openai(&server)], &[("K1", KEY_1)])
        .await;
    server.reply(
        "gpt-a",
        Reply::ToolCalls(vec![(
            "lookup".into(),
            json!({"q": "weather in Oslo", "n": 3}),
        )]),
    );

    let answer = models
        .call(
            &[model("openai", "gpt-a", &["K1"])],
            request(vec![Msg::user("what is the weather?")]),
            &site("t1"),
        )
        .await
        .unwrap();

    let call = &answer.thought.calls[0];
    assert_eq!(call.name, "lookup");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&call.arguments).unwrap(),
        json!({"q": "weather in Oslo", "n": 3})
    );
    assert_eq!(answer.stop_reason, "tool_calls");
    assert_eq!(answer.request_id.as_deref(), Some("req-1"));
    assert!(answer.thought.input_tokens >= 1 && answer.thought.output_tokens >= 1);
    assert_eq!(answer.thought.model, "openai/gpt-a");
    assert_eq!(answer.model.model, "gpt-a");
    assert_eq!(answer.key_hint, Some(key_hint(KEY_1)));
    assert_eq!(
        answer.thought.slot,
        Some(format!("openai/gpt-a#{}", key_hint(KEY_1).as_str())),
        "the slot names the entry and the key that served"
    );
    assert_eq!(answer.attempts.len(), 1);
    assert_eq!(answer.attempts[0].outcome, Outcome::Answered);

    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].bearer.as_deref(), Some(KEY_1));
    assert_eq!(seen[0].messages[0]["content"], "what is the weather?");
    assert_eq!(seen[0].tools[0]["function"]["name"], "lookup");
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_benches_the_key_for_the_fleet_and_the_next_key_answers() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let plugin = host.openai(&server);
    let secrets = [("K1", KEY_1), ("K2", KEY_2)];
    let chain = [model("openai", "gpt-a", &["K1", "K2"])];

    let node_a = Node::join(&nats, "node-a").await;
    let models_a = node_a.models(vec![plugin.clone()], &secrets).await;
    server.reply("gpt-a", Reply::rate_limited(40));
    server.reply("gpt-a", Reply::Text("second key here".into()));
    let before = SystemTime::now();
    let answer = models_a
        .call(&chain, request(vec![Msg::user("hi")]), &site("t1"))
        .await
        .unwrap();
    assert_eq!(answer.thought.text.as_deref(), Some("second key here"));
    assert_eq!(answer.key_hint, Some(key_hint(KEY_2)));
    assert!(
        matches!(
            &answer.attempts[0].outcome,
            Outcome::Failed { failure: Failure::RateLimited { retry_after_ms: Some(40_000) }, line }
                if line.contains("HTTP 429") && line.contains("request req-1")
        ),
        "{:?}",
        answer.attempts
    );
    let bearers: Vec<_> = server.requests().iter().map(|r| r.bearer.clone()).collect();
    assert_eq!(bearers, vec![Some(KEY_1.into()), Some(KEY_2.into())]);

    // The fleet knows: the record is an instant ≈ now + the bench, which is
    // the floor's minute, since the 40 s the vendor advised is under it.
    let pkey = models_a.provider_key(&chain[0]).unwrap();
    assert_eq!(pkey.as_str(), format!("openai:gpt-a@{}", server.base_url()));
    let cooling = node_a.coord.cooldowns().await.unwrap();
    assert_eq!(cooling.len(), 1, "{cooling:?}");
    assert_eq!(cooling[0].provider, pkey.as_str());
    assert_eq!(cooling[0].hint, key_hint(KEY_1));
    let ahead = cooling[0].until.duration_since(before).unwrap();
    assert!(
        ahead >= Duration::from_secs(59) && ahead <= Duration::from_secs(62),
        "{ahead:?}"
    );
    let benched = node_a.events("credential_benched");
    assert_eq!(benched.len(), 1);
    let p = &benched[0].payload;
    assert_eq!(p["key_hint"], key_hint(KEY_1).as_str());
    assert_eq!(p["provider"], pkey.as_str());
    assert_eq!(
        (
            p["turn_id"].as_str(),
            p["phase"].as_str(),
            p["iteration"].as_u64()
        ),
        (Some("t1"), Some("executor"), Some(2))
    );
    assert!(
        p["reason"]
            .as_str()
            .unwrap()
            .starts_with("rate-limited (HTTP 429"),
        "{p}"
    );
    assert!(!benched[0].payload.to_string().contains(KEY_1));

    // Another node that starts later never spends a call on the benched key.
    let node_b = Node::join(&nats, "node-b").await;
    let models_b = node_b.models(vec![plugin.clone()], &secrets).await;
    assert!(
        models_b
            .pool()
            .cooling_until(&pkey, &key_hint(KEY_1), SystemTime::now())
            .is_some(),
        "the first pull happened before new() returned"
    );
    let peer = node_b.events("credential_cooled_by_peer");
    assert_eq!(peer.len(), 1);
    assert_eq!(peer[0].payload["key_hint"], key_hint(KEY_1).as_str());
    for i in 0..3 {
        server.reply("gpt-a", Reply::Text(format!("b{i}")));
        let a = models_b
            .call(&chain, request(vec![Msg::user("hi")]), &site("t2"))
            .await
            .unwrap();
        assert_eq!(a.key_hint, Some(key_hint(KEY_2)));
    }
    let with_key_1 = server
        .requests()
        .iter()
        .filter(|r| r.bearer.as_deref() == Some(KEY_1))
        .count();
    assert_eq!(with_key_1, 1, "only node A's one 429");
    assert_eq!(server.requests().len(), 5);

    // The bench is scoped by entry: the same key under another model is fine.
    server.reply("gpt-b", Reply::Text("other entry".into()));
    let other = models_a
        .call(
            &[model("openai", "gpt-b", &["K1", "K2"])],
            request(vec![Msg::user("hi")]),
            &site("t3"),
        )
        .await
        .unwrap();
    assert_eq!(other.key_hint, Some(key_hint(KEY_1)));
    models_a.shutdown().await;
    models_b.shutdown().await;
}

/// How far ahead of `before` the fleet's record and this node's bench of
/// `hint` end, in whole seconds.
async fn benched_for(
    node: &Node,
    models: &Models,
    entry: &ModelRef,
    hint: &KeyHint,
    before: SystemTime,
) -> (u64, u64) {
    let pkey = models.provider_key(entry).unwrap();
    let cooling = node.coord.cooldowns().await.unwrap();
    let record = cooling
        .iter()
        .find(|c| c.provider == pkey.as_str() && &c.hint == hint)
        .unwrap_or_else(|| panic!("no fleet record for {pkey}: {cooling:?}"));
    let local = models
        .pool()
        .cooling_until(&pkey, hint, SystemTime::now())
        .expect("benched on this node");
    let ahead = |t: SystemTime| t.duration_since(before).unwrap().as_secs();
    (ahead(record.until), ahead(local))
}

/// A vendor advising one second does not make the bench one second: peers
/// pull every 15 s, so the bench lasts the floor — 60 s by default, or the
/// node's configured floor — here and in the fleet's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_advising_one_second_benches_the_key_for_the_floor() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let plugin = host.openai(&server);
    let node = Node::join(&nats, "node-a").await;
    let secrets = [("K1", KEY_1), ("K2", KEY_2)];
    let configured = ModelsOptions {
        cooldowns: CooldownPolicy::with_floor(Duration::from_secs(120)),
        ..ModelsOptions::default()
    };
    for (model_name, opts, floor) in [
        ("gpt-a", ModelsOptions::default(), 60),
        ("gpt-b", configured, 120),
    ] {
        let models = Models::new(
            crewlet_plugins::Installed::providers_only(vec![plugin.clone()]),
            node.coord.model_cooldowns(),
            Some(node.publisher.clone()),
            resolver(&secrets),
            opts,
        )
        .await;
        let entry = model("openai", model_name, &["K1", "K2"]);
        server.reply(model_name, Reply::rate_limited(1));
        server.reply(model_name, Reply::Text("second key".into()));
        let before = SystemTime::now();
        let answer = models
            .call(
                std::slice::from_ref(&entry),
                request(vec![Msg::user("hi")]),
                &site("t1"),
            )
            .await
            .unwrap();
        assert_eq!(answer.key_hint, Some(key_hint(KEY_2)), "{model_name}");
        let (record, local) = benched_for(&node, &models, &entry, &key_hint(KEY_1), before).await;
        for (what, ahead) in [("fleet record", record), ("local bench", local)] {
            assert!(
                (floor - 1..=floor + 2).contains(&ahead),
                "{model_name}: the {what} ends {ahead} s ahead, not at the {floor} s floor"
            );
        }
        models.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_rotates_the_key_and_benches_it_for_ten_minutes() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = node
        .models(vec![host.openai(&server)], &[("K1", KEY_1), ("K2", KEY_2)])
        .await;
    server.reply("gpt-a", Reply::error(401, "Incorrect API key provided"));
    server.reply("gpt-a", Reply::Text("ok".into()));
    let before = SystemTime::now();
    let answer = models
        .call(
            &[model("openai", "gpt-a", &["K1", "K2"])],
            request(vec![Msg::user("hi")]),
            &site("t1"),
        )
        .await
        .unwrap();
    assert_eq!(answer.key_hint, Some(key_hint(KEY_2)));
    let cooling = node.coord.cooldowns().await.unwrap();
    let ahead = cooling[0].until.duration_since(before).unwrap();
    assert!(
        ahead >= Duration::from_secs(599) && ahead <= Duration::from_secs(602),
        "{ahead:?}"
    );
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_model_falls_back_to_the_next_and_says_so() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = node
        .models(vec![host.openai(&server)], &[("K1", KEY_1)])
        .await;
    server.reply(
        "gpt-big",
        Reply::error(503, "The engine is currently overloaded"),
    );
    server.reply("gpt-small", Reply::Text("from the small one".into()));
    let chain = [
        model("openai", "gpt-big", &["K1"]),
        model("openai", "gpt-small", &["K1"]),
    ];
    let answer = models
        .call(&chain, request(vec![Msg::user("hi")]), &site("t7"))
        .await
        .unwrap();
    assert_eq!(answer.model.model, "gpt-small");
    assert_eq!(answer.thought.text.as_deref(), Some("from the small one"));
    assert_eq!(answer.attempts.len(), 2);

    let fallbacks = node.events("provider_fallback");
    assert_eq!(fallbacks.len(), 1);
    let p = &fallbacks[0].payload;
    assert_eq!(p["from"], "openai/gpt-big");
    assert_eq!(p["to"], "openai/gpt-small");
    assert_eq!(p["turn_id"], "t7");
    assert_eq!(p["trace_id"], "trace-t7");
    assert_eq!(fallbacks[0].trace_id.as_deref(), Some("trace-t7"));
    assert_eq!(
        p["reason"],
        format!(
            "overloaded (HTTP 503, request req-1): The engine is currently overloaded (calling {})",
            server.origin()
        )
    );
    assert!(
        node.coord.cooldowns().await.unwrap().is_empty(),
        "an overloaded vendor is not the key's fault"
    );
    assert!(node.events("credential_benched").is_empty());
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_chain_fails_with_the_last_line_and_no_key_in_sight() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = node
        .models(vec![host.openai(&server)], &[("K1", KEY_1)])
        .await;
    server.reply(
        "gpt-big",
        Reply::error(500, &format!("internal error for key {KEY_1}")),
    );
    server.reply(
        "gpt-small",
        Reply::error(500, &format!("boom, {KEY_1} is fine though")),
    );
    let chain = [
        model("openai", "gpt-big", &["K1"]),
        model("openai", "gpt-small", &["K1", "MISSING_KEY"]),
        model("nobody", "m", &["K1"]),
    ];
    let err = models
        .call(&chain, request(vec![Msg::user("hi")]), &site("t9"))
        .await
        .unwrap_err();
    assert_eq!(
        err.chain,
        vec!["openai/gpt-big", "openai/gpt-small", "nobody/m"]
    );
    assert!(
        err.last_error.starts_with("nobody/m: no-provider"),
        "{}",
        err.last_error
    );
    let text = err.to_string();
    assert!(!text.contains(KEY_1), "{text}");
    let lines: Vec<String> = err
        .attempts
        .iter()
        .map(|a| match &a.outcome {
            Outcome::Failed { line, .. } => line.clone(),
            Outcome::Answered => panic!("nothing answered"),
        })
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].starts_with("transient (HTTP 500, request req-1)"),
        "{lines:?}"
    );
    for l in &lines {
        assert!(!l.contains(KEY_1), "{l}");
    }

    let down = node.events("llm_unavailable");
    assert_eq!(down.len(), 1);
    let p = &down[0].payload;
    assert_eq!(
        p["chain"],
        json!(["openai/gpt-big", "openai/gpt-small", "nobody/m"])
    );
    assert_eq!(p["turn_id"], "t9");
    assert_eq!(node.events("provider_fallback").len(), 2);
    for row in node.events("provider_fallback").iter().chain(&down) {
        assert!(!row.payload.to_string().contains(KEY_1), "{}", row.payload);
    }

    // Every key cooling or unresolvable: the model is skipped without a call.
    let sent = server.requests().len();
    let err = models
        .call(
            &[model("openai", "gpt-big", &["NOT_SET"])],
            request(vec![Msg::user("hi")]),
            &site("t10"),
        )
        .await
        .unwrap_err();
    assert!(
        err.last_error.contains("no-key") && err.last_error.contains("NOT_SET is not set"),
        "{}",
        err.last_error
    );
    assert_eq!(server.requests().len(), sent, "no call without a key");
    models.shutdown().await;
}

/// Models over the openai guest with `resolve` for their keys.
async fn models_with(
    node: &Node,
    host: &Host,
    server: &ScriptedOpenAi,
    resolve: crewlet_models::Resolve,
) -> Models {
    Models::new(
        crewlet_plugins::Installed::providers_only(vec![host.openai(server)]),
        node.coord.model_cooldowns(),
        Some(node.publisher.clone()),
        resolve,
        ModelsOptions::default(),
    )
    .await
}

/// `K1` resolves to `KEY_1`; `LATER` is not known yet (the secrets bucket
/// has not answered); every other name is unset.
fn k1_and_later() -> crewlet_models::Resolve {
    let known = resolver(&[("K1", KEY_1)]);
    crewlet_models::Resolve::new(move |name: &str| match name {
        "LATER" => crewlet_secrets::Lookup::Unknown("the secrets bucket has not answered".into()),
        other => known.lookup(other),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_not_known_yet_stops_the_chain_with_no_fallback_and_no_llm_unavailable() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = models_with(&node, &host, &server, k1_and_later()).await;
    server.reply("gpt-b", Reply::Text("not asked".into()));
    let chain = [
        model("openai", "gpt-a", &["LATER"]),
        model("openai", "gpt-b", &["K1"]),
    ];
    let err = models
        .call(&chain, request(vec![Msg::user("hi")]), &site("t-unknown"))
        .await
        .unwrap_err();
    assert!(err.unknown, "{err}");
    assert!(err.last_error.contains("not answered"), "{err}");
    assert_eq!(server.request_count(), 0, "no model was called");
    assert!(node.events("provider_fallback").is_empty());
    assert!(node.events("llm_unavailable").is_empty());

    // A key unset (the store said so) is "no key": the chain falls back.
    let chain = [
        model("openai", "gpt-a", &["UNSET"]),
        model("openai", "gpt-b", &["K1"]),
    ];
    let answer = models
        .call(&chain, request(vec![Msg::user("hi")]), &site("t-unset"))
        .await
        .unwrap();
    assert_eq!(answer.model.model, "gpt-b");
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotated_while_a_call_holds_the_old_one_is_looked_up_again_and_answers() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let current = std::sync::Arc::new(std::sync::Mutex::new(KEY_1.to_owned()));
    let resolve = crewlet_models::Resolve::new({
        let current = current.clone();
        move |name: &str| match name {
            "K" => crewlet_secrets::Lookup::Found(current.lock().unwrap().clone()),
            _ => crewlet_secrets::Lookup::Unset,
        }
    });
    let models = models_with(&node, &host, &server, resolve).await;
    // The vendor is slow, then refuses the old key: rotated there meanwhile.
    server.reply(
        "gpt-a",
        Reply::Delayed(
            Duration::from_secs(3),
            Box::new(Reply::error(401, "Incorrect API key provided")),
        ),
    );
    server.reply("gpt-a", Reply::Text("answered with the new key".into()));
    let chain = [model("openai", "gpt-a", &["K"])];
    let at = site("t-rot");
    let call = models.call(&chain, request(vec![Msg::user("hi")]), &at);
    let rotate = async {
        while server.request_count() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        *current.lock().unwrap() = KEY_2.to_owned();
        std::time::Instant::now()
    };
    let (answer, rotated) = tokio::join!(call, rotate);
    let answer = answer.unwrap();
    let seen = server.requests();
    assert!(
        rotated.duration_since(seen[0].at) < Duration::from_secs(3),
        "the rotation landed after the old key's answer"
    );
    assert_eq!(answer.key_hint, Some(key_hint(KEY_2)));
    assert_eq!(
        seen.iter().map(|r| r.bearer.clone()).collect::<Vec<_>>(),
        [Some(KEY_1.to_owned()), Some(KEY_2.to_owned())]
    );
    assert!(node.events("llm_unavailable").is_empty());
    assert_eq!(node.events("credential_benched").len(), 1);
    models.shutdown().await;
}

/// The model layer is the turn engine's brain: the prompt goes out in the
/// vendor's words, the answer comes back a thought, and an exhausted chain
/// and a key not known yet stay two different outages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_the_turn_engines_brain_it_thinks_or_says_which_outage() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = models_with(&node, &host, &server, k1_and_later()).await;
    let chain = [model("openai", "gpt-a", &["K1"])];
    server.reply(
        "gpt-a",
        Reply::ToolCalls(vec![("lookup".into(), json!({"q": "oslo"}))]),
    );
    let mut prompt = request(vec![Msg::system("be brief"), Msg::user("weather?")]);
    prompt.must_call_tool = true;
    let thought = models
        .think(&chain, prompt, &site("t-brain"))
        .await
        .unwrap();
    assert_eq!(thought.model, "openai/gpt-a");
    assert_eq!(thought.calls.len(), 1);
    assert_eq!(thought.calls[0].name, "lookup");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&thought.calls[0].arguments).unwrap(),
        json!({"q": "oslo"})
    );
    assert!(thought.input_tokens >= 1 && thought.output_tokens >= 1);
    let sent = &server.requests()[0];
    assert_eq!(sent.messages[0]["role"], "system");
    assert_eq!(sent.messages[1]["role"], "user");
    assert_eq!(sent.messages[1]["content"], "weather?");
    assert_eq!(sent.body["tool_choice"], "required");
    assert_eq!(
        sent.tools[0]["function"]["parameters"],
        json!({"type": "object", "properties": {"q": {"type": "string"}}})
    );

    server.reply("gpt-a", Reply::error(500, "boom"));
    let down = models
        .think(&chain, request(vec![Msg::user("hi")]), &site("t-down"))
        .await
        .unwrap_err();
    assert!(
        matches!(&down, Unavailable::Chain(line) if line.contains("transient (HTTP 500")),
        "{down}"
    );
    let later = models
        .think(
            &[model("openai", "gpt-a", &["LATER"])],
            request(vec![Msg::user("hi")]),
            &site("t-later"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&later, Unavailable::KeyUnknown(line) if line.contains("not answered")),
        "{later}"
    );
    assert_eq!(server.request_count(), 2, "no call without a known key");
    models.shutdown().await;
}
