//! The scripted provider (the shipped component, in real wasmtime): steps
//! chosen by the conversation, templates from the ```wake block and the last
//! tool result, fail injection through the model layer, and malformed
//! options answered as bad-request, never a fault.

use crate::common;

use common::{Host, Node, request, scripted, site};
use crewlet_models::{Failure, Outcome};
use crewlet_plugins::provider::{
    Credential, ErrorKind, Message, Request, Role, ToolCall, ToolChoice,
};
use crewlet_testkit::NatsServer;
use crewlet_turns::Msg;
use serde_json::json;

const WAKE: &str = "You were woken.\n```wake\n{\"channel\":\"C1\",\"thread\":\"17.1\",\"text\":\"hi there\",\"handle\":\"ada\",\"source\":\"slack\",\"n\":3}\n```\nAnswer in the thread.";

fn options() -> serde_json::Value {
    json!({"steps": [
        {"call": "post_message", "args": {
            "channel": "{{wake.channel}}",
            "thread": "{{wake.thread}}",
            "text": "echo: {{wake.text}} ({{wake.n}}) {{wake.nope}} {{mystery}}",
            "nested": [{"who": "{{wake.handle}}"}, 7, true]
        }},
        {"say": "the tool said: {{last_tool_result}}"},
        {"calls": [{"call": "a"}, {"call": "b", "args": {"x": "{{wake.source}}"}}],
         "usage": {"input": 11, "output": 22}}
    ]})
}

fn direct(messages: Vec<Message>, options: &serde_json::Value) -> Request {
    Request {
        base_url: String::new(),
        model: "demo".into(),
        messages,
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: 100,
        credential: Credential {
            api_key: String::new(),
        },
        options_json: options.to_string(),
    }
}

/// A message in the provider world's words, for calling the plugin direct.
fn msg(role: Role, content: &str) -> Message {
    Message {
        role,
        content: content.into(),
        tool_calls: vec![],
        tool_call_id: None,
    }
}

fn assistant_calls(calls: Vec<ToolCall>) -> Message {
    Message {
        role: Role::Assistant,
        content: String::new(),
        tool_calls: calls,
        tool_call_id: None,
    }
}

fn tool_result(id: &str, content: &str) -> Message {
    Message {
        role: Role::Tool,
        content: content.into(),
        tool_calls: vec![],
        tool_call_id: Some(id.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_follow_the_conversation_and_templates_fill_from_the_wake_block() {
    let host = Host::new();
    let p = host.scripted();
    let opts = options();
    let mut conversation = vec![msg(Role::System, "you are ada"), msg(Role::User, WAKE)];

    // Step 0: a tool call with templated arguments.
    let step0 = p
        .complete(direct(conversation.clone(), &opts))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(step0.text, None);
    assert_eq!(step0.stop_reason, "tool_calls");
    assert_eq!(step0.request_id.as_deref(), Some("scripted-0"));
    assert_eq!(step0.tool_calls.len(), 1);
    assert_eq!(step0.tool_calls[0].id, "call-0-0");
    assert_eq!(step0.tool_calls[0].name, "post_message");
    let args: serde_json::Value =
        serde_json::from_str(&step0.tool_calls[0].arguments_json).unwrap();
    assert_eq!(
        args,
        json!({
            "channel": "C1",
            "thread": "17.1",
            "text": "echo: hi there (3) {{wake.nope}} {{mystery}}",
            "nested": [{"who": "ada"}, 7, true]
        })
    );
    let input_chars = "you are ada".len() + WAKE.chars().count();
    assert_eq!(step0.usage.input_tokens as usize, input_chars / 4);
    let answer_chars = "post_message".len() + step0.tool_calls[0].arguments_json.chars().count();
    assert_eq!(step0.usage.output_tokens as usize, answer_chars / 4);

    // Step 1: says the last tool result.
    conversation.push(assistant_calls(step0.tool_calls.clone()));
    conversation.push(tool_result("call-0-0", "posted as 17.2"));
    let step1 = p
        .complete(direct(conversation.clone(), &opts))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(step1.text.as_deref(), Some("the tool said: posted as 17.2"));
    assert_eq!(step1.stop_reason, "stop");
    assert!(step1.tool_calls.is_empty());

    // Step 2: several calls, explicit usage; and past the end it repeats.
    conversation.push(msg(Role::Assistant, "the tool said: posted as 17.2"));
    for extra in 0..2 {
        let step = p
            .complete(direct(conversation.clone(), &opts))
            .await
            .unwrap()
            .unwrap();
        let at = 2 + extra;
        let ids: Vec<_> = step.tool_calls.iter().map(|c| c.id.clone()).collect();
        assert_eq!(ids, vec![format!("call-{at}-0"), format!("call-{at}-1")]);
        assert_eq!(step.tool_calls[1].arguments_json, r#"{"x":"slack"}"#);
        assert_eq!(step.tool_calls[0].arguments_json, "{}");
        assert_eq!(
            (step.usage.input_tokens, step.usage.output_tokens),
            (11, 22)
        );
        conversation.push(assistant_calls(step.tool_calls.clone()));
    }

    // No wake block: placeholders stay as they are.
    let plain = json!({"steps": [{"say": "hello {{wake.handle}}"}]});
    let a = p
        .complete(direct(
            vec![msg(Role::User, "no block here {\"handle\":\"x\"}")],
            &plain,
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.text.as_deref(), Some("hello {{wake.handle}}"));
    assert_eq!((a.usage.input_tokens, a.usage.output_tokens), (7, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_options_answer_bad_request_naming_the_problem() {
    let host = Host::new();
    let p = host.scripted();
    let cases: &[(&str, &str)] = &[
        ("not json", "options are not JSON"),
        ("[1,2]", "options must be a table"),
        ("{}", "`steps` is missing"),
        (r#"{"steps": []}"#, "`steps` is empty"),
        (r#"{"steps": {"say": "x"}}"#, "`steps` must be a list"),
        (r#"{"steps": ["x"]}"#, "steps[0]: a step must be a table"),
        (
            r#"{"steps": [{"say": "a"}, {"sya": "b"}]}"#,
            "steps[1]: unknown key `sya`",
        ),
        (
            r#"{"steps": [{"say": 3}]}"#,
            "steps[0]: `say` must be a string",
        ),
        (
            r#"{"steps": [{"say": "a", "call": "t"}]}"#,
            "exactly one of",
        ),
        (r#"{"steps": [{"call": ""}]}"#, "`call` must name a tool"),
        (
            r#"{"steps": [{"call": "t", "args": [1]}]}"#,
            "`args` must be a table",
        ),
        (
            r#"{"steps": [{"calls": []}]}"#,
            "`calls` must be a non-empty list",
        ),
        (
            r#"{"steps": [{"calls": [{"call": "t", "say": "x"}]}]}"#,
            "calls[0]: unknown key `say`",
        ),
        (
            r#"{"steps": [{"say": "a", "fail": "exploded"}]}"#,
            "`fail` \"exploded\" is not one of",
        ),
        (
            r#"{"steps": [{"say": "a", "retry_after": 3}]}"#,
            "`retry_after` goes only with",
        ),
        (
            r#"{"steps": [{"say": "a", "usage": {"input": -1}}]}"#,
            "usage.input must be a whole number",
        ),
        (
            r#"{"steps": [{}]}"#,
            "a step needs `say`, `call` or `calls`",
        ),
    ];
    for (options, expected) in cases {
        let mut req = direct(vec![msg(Role::User, "hi")], &json!({}));
        req.options_json = options.to_string();
        let e = p.complete(req).await.expect("never a fault").unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest, "{options}");
        assert!(
            e.message.contains(expected)
                && e.message
                    .starts_with("scripted provider: malformed options"),
            "{options}: {}",
            e.message
        );
    }
    assert_eq!(p.health().total_faults, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_failures_drive_the_chain_like_a_vendor_would() {
    let nats = NatsServer::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let models = node.models(vec![host.scripted()], &[]).await;
    let flaky = scripted("flaky", json!({"steps": [{"fail": "overloaded"}]}));
    let limited = scripted(
        "limited",
        json!({"steps": [{"fail": "rate-limited", "retry_after": 90}]}),
    );
    let good = scripted("good", json!({"steps": [{"say": "hello {{wake.handle}}"}]}));

    let answer = models
        .call(
            &[flaky.clone(), limited.clone(), good.clone()],
            request(vec![Msg::user(WAKE)]),
            &site("t1"),
        )
        .await
        .unwrap();
    assert_eq!(answer.model.model, "good");
    assert_eq!(answer.thought.text.as_deref(), Some("hello ada"));
    assert_eq!(answer.key_hint, None, "keyless");
    let slot = answer.thought.slot.as_deref().unwrap_or_default();
    assert!(
        slot.ends_with("/good#keyless"),
        "the chain's third entry served, keyless: {slot}"
    );
    let failures: Vec<_> = answer
        .attempts
        .iter()
        .filter_map(|a| match &a.outcome {
            Outcome::Failed { failure, .. } => Some(failure.clone()),
            Outcome::Answered => None,
        })
        .collect();
    assert_eq!(
        failures,
        vec![
            Failure::Overloaded,
            Failure::RateLimited {
                retry_after_ms: Some(90_000)
            },
            Failure::NoKey
        ],
        "a keyless entry that is rate-limited is benched, then has no key left"
    );
    let hops: Vec<_> = node
        .events("provider_fallback")
        .iter()
        .map(|e| (e.payload["from"].clone(), e.payload["to"].clone()))
        .collect();
    assert_eq!(
        hops,
        vec![
            (json!("scripted/flaky"), json!("scripted/limited")),
            (json!("scripted/limited"), json!("scripted/good"))
        ]
    );
    assert_eq!(node.events("credential_benched").len(), 1);

    // Benched for the fleet: the next call skips it without calling.
    let again = models
        .call(
            &[limited, good],
            request(vec![Msg::user(WAKE)]),
            &site("t2"),
        )
        .await
        .unwrap();
    assert!(
        matches!(
            &again.attempts[0].outcome,
            Outcome::Failed { failure: Failure::NoKey, line } if line.contains("cooling")
        ),
        "{:?}",
        again.attempts
    );

    // A malformed entry is a bad request, and the chain moves on.
    let broken = scripted("broken", json!({"steps": "nope"}));
    let err = models
        .call(&[broken], request(vec![Msg::user("hi")]), &site("t3"))
        .await
        .unwrap_err();
    assert!(
        err.last_error.contains("bad-request") && err.last_error.contains("`steps` must be a list"),
        "{}",
        err.last_error
    );
    models.shutdown().await;
}

/// A wake with no channel or thread to answer in: the reply's arguments
/// name none (never a channel called "null"), so the chat tool refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_field_that_is_null_is_left_out_never_posted_as_the_word_null() {
    let host = Host::new();
    let p = host.scripted();
    let wake = "```wake\n{\"channel\":null,\"thread\":null,\"text\":\"a reaction\",\"handle\":\"ada\"}\n```";
    let step = p
        .complete(direct(
            vec![msg(Role::System, "you are ada"), msg(Role::User, wake)],
            &options(),
        ))
        .await
        .unwrap()
        .unwrap();
    let args: serde_json::Value = serde_json::from_str(&step.tool_calls[0].arguments_json).unwrap();
    assert_eq!(
        args,
        json!({
            "text": "echo: a reaction ({{wake.n}}) {{wake.nope}} {{mystery}}",
            "nested": [{"who": "ada"}, 7, true]
        }),
        "no channel, no thread, and no \"null\" anywhere"
    );
}
