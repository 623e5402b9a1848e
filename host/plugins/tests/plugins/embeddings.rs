//! The provider world's `embeddings` export (WIT 0.4.2) through the real
//! components: the OpenAI plugin against a local OpenAI-compatible server,
//! the scripted provider's bag of words, Anthropic's refusal, and a 0.4.1
//! provider component (kept as a fixture) that still loads and completes
//! but does not embed.

use crate::common;

use common::{manifest_text, runtime};
use crewlet_plugins::provider::{
    Credential, EmbedError, EmbedRequest, ErrorKind, Message, ProviderPlugin, Request, Role,
    ToolChoice,
};
use crewlet_testkit::{Reply, ScriptedOpenAi};

fn embed_request(model: &str, inputs: &[&str], options_json: &str) -> EmbedRequest {
    EmbedRequest {
        base_url: "https://ignored.example.com".into(),
        model: model.into(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        credential: Credential {
            api_key: "sk-embed-key".into(),
        },
        options_json: options_json.into(),
    }
}

/// The scripted provider as shipped, or built as `component`.
fn scripted(component: &str) -> (ProviderPlugin, tempfile::TempDir) {
    let (rt, data) = runtime();
    let m = manifest_text(
        "providers/scripted",
        &format!(
            "name = \"scripted\"\nversion = \"0.1.0\"\nkind = \"provider\"\ncomponent = \"{component}\"\n\
             [limits]\ndeadline_ms = 2000\n[provider]\nbase_url = \"http://scripted.invalid\"\n\
             allowed_outbound_hosts = [\"http://scripted.invalid\"]\noptions = [\"steps\", \"dimensions\"]\n"
        ),
    );
    (
        ProviderPlugin::load(&rt, m).unwrap_or_else(|e| panic!("{e}")),
        data,
    )
}

const SCRIPTED: &str = "../../target/wasm32-wasip2/release/crewlet_provider_scripted.wasm";
const SCRIPTED_0_4_1: &str = "../../../host/plugins/tests/fixtures/scripted-wit-0.4.1.wasm";

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test]
async fn the_scripted_embedder_is_deterministic_and_puts_shared_words_near() {
    let (p, _data) = scripted(SCRIPTED);
    assert!(p.embeds());
    let texts = [
        "the billing service failed to deploy",
        "Deploy of the BILLING service",
        "lunch menu on friday",
    ];
    let first = p
        .embed(embed_request("bag-of-words", &texts, "{}"))
        .await
        .expect("no fault")
        .expect("vectors");
    let again = p
        .embed(embed_request("bag-of-words", &texts, "{}"))
        .await
        .expect("no fault")
        .expect("vectors");
    assert_eq!(
        first.vectors, again.vectors,
        "the same texts, the same vectors"
    );
    assert_eq!(first.vectors.len(), 3);
    assert!(first.vectors.iter().all(|v| v.len() == 256));
    let v = &first.vectors;
    assert!((cosine(&v[0], &v[0]) - 1.0).abs() < 1e-5, "unit length");
    assert!(cosine(&v[0], &v[1]) > 0.5, "{}", cosine(&v[0], &v[1]));
    assert!(cosine(&v[0], &v[2]).abs() < 0.2, "{}", cosine(&v[0], &v[2]));
    assert!(first.input_tokens > 0);

    let small = p
        .embed(embed_request(
            "bag-of-words",
            &texts[..1],
            r#"{"dimensions":16}"#,
        ))
        .await
        .expect("no fault")
        .expect("vectors");
    assert_eq!(small.vectors[0].len(), 16);

    // Not a real model: another name is refused, saying so.
    let other = p
        .embed(embed_request("text-embedding-3-small", &texts, "{}"))
        .await
        .expect("no fault");
    match other {
        Err(EmbedError::Unsupported(why)) => {
            assert!(
                why.contains("not a real model") && why.contains("bag-of-words"),
                "{why}"
            )
        }
        other => panic!("expected unsupported, got {other:?}"),
    }
}

#[tokio::test]
async fn openai_embeds_over_v1_embeddings_and_the_server_sees_the_batch() {
    let server = ScriptedOpenAi::start();
    server.reply(
        "text-embedding-3-small",
        Reply::Vectors(vec![vec![0.5, 0.25, -1.0], vec![1.0, 0.0, 0.0]]),
    );
    server.reply("text-embedding-3-small", Reply::rate_limited(7));
    let (rt, _data) = runtime();
    let m = manifest_text(
        "providers/openai",
        &format!(
            "name = \"openai\"\nversion = \"0.1.0\"\nkind = \"provider\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_provider_openai.wasm\"\n\
             [limits]\ndeadline_ms = 10000\n[provider]\nbase_url = \"{}\"\nallowed_outbound_hosts = [\"{}\"]\n",
            server.base_url(),
            server.origin()
        ),
    );
    let p = ProviderPlugin::load(&rt, m).unwrap_or_else(|e| panic!("{e}"));
    let answer = p
        .embed(embed_request(
            "text-embedding-3-small",
            &["first text", "second"],
            "{}",
        ))
        .await
        .expect("no fault")
        .expect("vectors");
    // The server lists the items last first: the plugin orders them by index.
    assert_eq!(
        answer.vectors,
        vec![vec![0.5, 0.25, -1.0], vec![1.0, 0.0, 0.0]]
    );
    assert_eq!(
        answer.input_tokens, 4,
        "a quarter of the 16 characters sent"
    );
    assert_eq!(answer.request_id.as_deref(), Some("req-1"));
    let seen = server.requests();
    assert_eq!(seen[0].path, "/v1/embeddings");
    assert_eq!(seen[0].bearer.as_deref(), Some("sk-embed-key"));
    assert_eq!(
        seen[0].body,
        serde_json::json!({"model": "text-embedding-3-small", "input": ["first text", "second"]})
    );

    let limited = p
        .embed(embed_request("text-embedding-3-small", &["x"], "{}"))
        .await
        .expect("no fault");
    match limited {
        Err(EmbedError::Failed(e)) => {
            assert_eq!(e.kind, ErrorKind::RateLimited(Some(7000)));
            assert!(!e.message.contains("sk-embed-key"), "{}", e.message);
        }
        other => panic!("expected a classified 429, got {other:?}"),
    }
}

#[tokio::test]
async fn anthropic_answers_that_it_does_not_embed() {
    let (rt, _data) = runtime();
    let m = manifest_text(
        "providers/anthropic",
        "name = \"anthropic\"\nversion = \"0.1.0\"\nkind = \"provider\"\ncomponent = \"../../target/wasm32-wasip2/release/crewlet_provider_anthropic.wasm\"\n\
         [limits]\ndeadline_ms = 2000\n[provider]\nbase_url = \"http://127.0.0.1:9/v1\"\nallowed_outbound_hosts = [\"http://127.0.0.1:9\"]\n",
    );
    let p = ProviderPlugin::load(&rt, m).unwrap_or_else(|e| panic!("{e}"));
    match p.embed(embed_request("any", &["x"], "{}")).await {
        Ok(Err(EmbedError::Unsupported(why))) => assert!(why.contains("Anthropic"), "{why}"),
        other => panic!("expected unsupported, got {other:?}"),
    }
}

/// A provider built against WIT 0.4.1 (the scripted provider before
/// embeddings, kept as a fixture) loads, completes as before, and answers
/// every embedding "does not embed" without running.
#[tokio::test]
async fn a_provider_component_of_wit_0_4_1_completes_but_does_not_embed() {
    let (old, _data) = scripted(SCRIPTED_0_4_1);
    assert!(!old.embeds());
    let req = Request {
        base_url: String::new(),
        model: "demo".into(),
        messages: vec![Message {
            role: Role::User,
            content: "hello".into(),
            tool_calls: vec![],
            tool_call_id: None,
        }],
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: 64,
        credential: Credential {
            api_key: String::new(),
        },
        options_json: r#"{"steps":[{"say":"still here"}]}"#.into(),
    };
    let completion = old
        .complete(req.clone())
        .await
        .expect("no fault")
        .expect("a completion");
    assert_eq!(completion.text.as_deref(), Some("still here"));
    let (today, _d) = scripted(SCRIPTED);
    let now = today.complete(req).await.expect("no fault").expect("ok");
    assert_eq!(completion, now, "0.4.1 and today's build complete alike");

    match old
        .embed(embed_request("bag-of-words", &["x"], "{}"))
        .await
        .expect("no fault")
    {
        Err(EmbedError::Unsupported(why)) => {
            assert!(
                why.contains("does not embed")
                    && why.contains("crewlet:plugin@0.4.1")
                    && why.contains("crewlet:plugin@0.4.2"),
                "{why}"
            );
        }
        other => panic!("expected does-not-embed, got {other:?}"),
    }
    assert_eq!(old.health().total_calls, 1, "the refusal ran nothing");
}
