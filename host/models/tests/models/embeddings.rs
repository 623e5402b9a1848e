//! The company's embedding model as the turn engine's `Embedder`, over the
//! real provider components: the OpenAI plugin against a local
//! OpenAI-compatible server (`/v1/embeddings`), the scripted provider's bag
//! of words, and a 0.4.1 provider that does not embed — through the same
//! key pool, fleet cooldowns (real NATS) and budget windows as completions.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use common::{Host, Node, relative_from};
use crewlet_company::{Active, ActiveCompany, Company};
use crewlet_coord::{Answer, Caps, Scope, key_hint};
use crewlet_models::Embeddings;
use crewlet_plugins::manifest::Manifest;
use crewlet_plugins::provider::ProviderPlugin;
use crewlet_testkit::{NatsServer, Reply, ScriptedOpenAi};
use crewlet_turns::{EmbedError, EmbedSite, Embedder, windows_at};

const KEY_1: &str = "live-key-0001-aaaaaaaaaaaa";
const KEY_2: &str = "live-key-0002-bbbbbbbbbbbb";

/// A company whose seat `ada` may spend `day` tokens a day, embedding with
/// `embedding` (a `[memory] embedding` value; none when empty).
fn company(embedding: &str, day: Option<u64>) -> ActiveCompany {
    let memory = if embedding.is_empty() {
        String::new()
    } else {
        format!("[memory]\nembedding = {embedding}\n")
    };
    let budget = day.map_or(String::new(), |d| format!("budget = {{ day = {d} }}\n"));
    let doc = format!(
        "[org]\nname = \"Acme\"\n[roles.r]\nsystem_prompt = \"x\"\n{budget}executor = [{{ provider = \"scripted\", model = \"m\" }}]\nreviewer = {{ provider = \"scripted\", model = \"m\" }}\n[seats]\nada = {{ role = \"r\" }}\n{memory}"
    );
    let company = Company::parse(&doc).unwrap_or_else(|e| panic!("{e}"));
    ActiveCompany::new(Some(Active::local(company)))
}

const OPENAI: &str =
    "{ provider = \"openai\", model = \"text-emb\", credentials = [\"${K1}\", \"${K2}\"] }";

fn site() -> EmbedSite {
    EmbedSite {
        seat: "ada".into(),
        turn_id: Some("t1".into()),
    }
}

fn texts(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

async fn embedder(
    node: &Node,
    providers: Vec<Arc<ProviderPlugin>>,
    active: ActiveCompany,
) -> (crewlet_models::Models, Embeddings) {
    let models = node
        .models(providers, &[("K1", KEY_1), ("K2", KEY_2)])
        .await;
    let e = models.embedder(node.coord.budgets(), active);
    (models, e)
}

/// What the seat spent today.
async fn spent_today(node: &Node, active: &ActiveCompany) -> u64 {
    let company = active.current().unwrap().company;
    let windows = windows_at(&company, SystemTime::now());
    let view = node
        .coord
        .budgets()
        .budget(&Scope::Seat("ada".into()), &windows)
        .await
        .unwrap();
    view.slot(crewlet_coord::Period::Day).spent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_benches_the_key_the_next_answers_and_the_tokens_are_charged() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let active = company(OPENAI, Some(100_000));
    let (models, e) = embedder(&node, vec![host.openai(&server)], active.clone()).await;
    assert_eq!(e.model().as_deref(), Some("openai/text-emb"));
    server.reply("text-emb", Reply::rate_limited(30));
    server.reply(
        "text-emb",
        Reply::billed(7, 0, Reply::Vectors(vec![vec![1.0, 0.0], vec![0.0, 1.0]])),
    );

    let embedded = e
        .embed(texts(&["a note", "another note"]), &site())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(embedded.model, "openai/text-emb");
    assert_eq!(embedded.vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
    assert_eq!(embedded.tokens, 7);

    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|r| r.path == "/v1/embeddings"));
    assert_eq!(seen[0].bearer.as_deref(), Some(KEY_1));
    assert_eq!(seen[1].bearer.as_deref(), Some(KEY_2));
    assert_eq!(
        seen[1].body["input"],
        serde_json::json!(["a note", "another note"])
    );

    // Key 1 is benched for the fleet, the event says it was an embedding.
    let cooling = node.coord.cooldowns().await.unwrap();
    assert_eq!(cooling.len(), 1, "{cooling:?}");
    assert_eq!(cooling[0].hint, key_hint(KEY_1));
    let benched = node.events("credential_benched");
    assert_eq!(benched.len(), 1);
    assert_eq!(benched[0].payload["phase"], "embedding");
    assert_eq!(benched[0].payload["turn_id"], "t1");

    // Charged to the seat, and a model call in its spend.
    assert_eq!(spent_today(&node, &active).await, 7);
    let calls = node.events("model_call");
    assert_eq!(calls.len(), 1);
    let p = &calls[0].payload;
    assert_eq!(
        (
            p["phase"].as_str(),
            p["model"].as_str(),
            p["input_tokens"].as_u64(),
            p["seat"].as_str()
        ),
        (
            Some("embedding"),
            Some("openai/text-emb"),
            Some(7),
            Some("ada")
        )
    );
    assert_eq!(
        p["slot"],
        format!("openai/text-emb#{}", key_hint(KEY_2).as_str()),
        "the second key served the embedding"
    );
    assert!(!calls[0].payload.to_string().contains(KEY_1));
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_provider_is_unavailable_and_then_cooling_sends_nothing() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let one_key = "{ provider = \"openai\", model = \"text-emb\", credentials = \"${K1}\" }";
    let active = company(one_key, None);
    let (models, e) = embedder(&node, vec![host.openai(&server)], active.clone()).await;
    server.reply("text-emb", Reply::rate_limited(30));

    match e.embed(texts(&["x"]), &site()).await {
        Err(EmbedError::Unavailable(line)) => {
            assert!(line.contains("rate-limited (HTTP 429"), "{line}");
            assert!(!line.contains(KEY_1), "{line}");
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert_eq!(node.coord.cooldowns().await.unwrap().len(), 1);
    match e.embed(texts(&["x"]), &site()).await {
        Err(EmbedError::Unavailable(line)) => assert!(line.contains("cooling"), "{line}"),
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert_eq!(server.requests().len(), 1, "the cooling key was not sent");
    assert_eq!(spent_today(&node, &active).await, 0);
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_window_refuses_the_embedding_with_nothing_sent() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let active = company(OPENAI, Some(20));
    let (models, e) = embedder(&node, vec![host.openai(&server)], active.clone()).await;
    let company = active.current().unwrap().company;
    let windows = windows_at(&company, SystemTime::now());
    let seat_caps = Caps {
        day: Some(20),
        ..Caps::default()
    };
    let charged = node
        .coord
        .budgets()
        .charge("ada", &windows, &Caps::default(), &seat_caps, 20)
        .await
        .unwrap();
    assert!(matches!(charged, Answer::Yes(_)), "the window is now full");

    match e.embed(texts(&["remember the deploy"]), &site()).await {
        Err(EmbedError::Refused(why)) => assert!(why.contains("seat ada"), "{why}"),
        other => panic!("expected refused, got {other:?}"),
    }
    assert!(server.requests().is_empty(), "nothing was sent");
    assert!(node.events("model_call").is_empty());
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectors_of_the_wrong_count_are_malformed_but_still_charged() {
    let nats = NatsServer::start();
    let server = ScriptedOpenAi::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let active = company(OPENAI, None);
    let (models, e) = embedder(&node, vec![host.openai(&server)], active.clone()).await;
    server.reply(
        "text-emb",
        Reply::billed(3, 0, Reply::Vectors(vec![vec![1.0, 0.0]])),
    );

    match e.embed(texts(&["one", "two"]), &site()).await {
        Err(EmbedError::Malformed(why)) => assert!(why.contains("1 vectors for 2 texts"), "{why}"),
        other => panic!("expected malformed, got {other:?}"),
    }
    assert_eq!(spent_today(&node, &active).await, 3, "the vendor billed it");
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripted_bag_of_words_embeds_and_no_model_is_off() {
    let nats = NatsServer::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let active = company("\"scripted/bag-of-words\"", None);
    let (models, e) = embedder(&node, vec![host.scripted()], active.clone()).await;
    assert_eq!(e.model().as_deref(), Some("scripted/bag-of-words"));
    let a = e
        .embed(texts(&["deploy the billing service"]), &site())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = e
        .embed(texts(&["deploy the billing service"]), &site())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.vectors, b.vectors);
    assert_eq!(a.vectors[0].len(), 256);
    assert_eq!(a.model, "scripted/bag-of-words");
    assert!(spent_today(&node, &active).await >= 2);

    // A new revision without `[memory] embedding` turns it off at once.
    active.set(company("\"none\"", None).current());
    assert_eq!(e.model(), None);
    assert!(matches!(
        e.embed(texts(&["x"]), &site()).await,
        Err(EmbedError::Off)
    ));
    models.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_of_wit_0_4_1_is_unavailable_saying_it_does_not_embed() {
    let nats = NatsServer::start();
    let host = Host::new();
    let node = Node::join(&nats, "node-a").await;
    let dir = host.dir.path().join("plugins/scripted");
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins/tests/fixtures/scripted-wit-0.4.1.wasm")
        .canonicalize()
        .unwrap();
    let file = dir.join("plugin.toml");
    std::fs::write(
        &file,
        format!(
            "name = \"scripted\"\nversion = \"0.1.0\"\nkind = \"provider\"\ncomponent = {:?}\n[limits]\ndeadline_ms = 2000\n[provider]\nbase_url = \"http://scripted.invalid\"\nallowed_outbound_hosts = [\"http://scripted.invalid\"]\n",
            relative_from(&dir, &fixture)
        ),
    )
    .unwrap();
    let m = Manifest::load(&file).unwrap_or_else(|e| panic!("{e}"));
    let old = Arc::new(ProviderPlugin::load(&host.runtime, m).unwrap_or_else(|e| panic!("{e}")));
    let active = company("\"scripted/bag-of-words\"", None);
    let (models, e) = embedder(&node, vec![old], active).await;
    match e.embed(texts(&["x"]), &site()).await {
        Err(EmbedError::Unavailable(line)) => {
            assert!(
                line.contains("does not embed") && line.contains("crewlet:plugin@0.4.1"),
                "{line}"
            )
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    assert!(node.events("model_call").is_empty());
    models.shutdown().await;
}
