//! The model layer's cost, two ways, in one run:
//!
//! 1. In process: `Models::call` through the scripted provider vs calling
//!    the `ProviderPlugin` directly with the same request. The difference is
//!    what the layer adds (resolving keys, leasing, converting the prompt,
//!    recording attempts).
//! 2. Over HTTP, the figure a team choosing a gateway compares: one chat
//!    completion from `ScriptedOpenAi` (a local OpenAI-compatible server)
//!    three ways — a direct HTTP call (hyper's pooled client, the transport
//!    the provider plugins use), `Models::call` through the real OpenAI
//!    provider plugin over `wasi:http`, and LiteLLM's proxy forwarding to
//!    the same server — interleaved, per-call p50/p99.
//!
//! Coordination is the in-process twin: no call reads it (pulls run on their
//! own clock), so a real server would change nothing measured here.
//!
//! Run: cargo bench -p crewlet-models --bench models (after the plugin
//! build; LiteLLM's proxy from `scripts/bootstrap.sh --browser`).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crewlet_company::{ModelRef, SecretRef};
use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Coord, CoordOptions, MemoryKv, Owner, SystemClock};
use crewlet_models::{Models, ModelsOptions, Resolve};
use crewlet_plugins::manifest::Manifest;
use crewlet_plugins::provider::{Credential, Message, ProviderPlugin, Request, Role, ToolChoice};
use crewlet_plugins::runtime::{Runtime, RuntimeConfig};
use crewlet_testkit::litellm::{MASTER_KEY, Upstream};
use crewlet_testkit::{LiteLlm, PluginsDir, Reply, ScriptedOpenAi};
use crewlet_turns::{CallSite, Msg, Phase, Prompt};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

const ITERATIONS: u32 = 1_000;
const ROUNDS: u32 = 5;

/// The HTTP comparison: calls per path per round, and the warm-up calls
/// before each round's timed ones.
const HTTP_CALLS: usize = 400;
const HTTP_WARMUP: usize = 40;
const HTTP_ROUNDS: usize = 5;

const SYSTEM: &str = "You are ada, a careful engineer.";
const WAKE: &str = "```wake\n{\"channel\":\"C1\",\"thread\":\"17.1\",\"text\":\"hi\",\"handle\":\"ada\",\"source\":\"slack\"}\n```";
const ANSWER: &str = "hello ada";
/// The model every HTTP path asks for, on the one server.
const MODEL: &str = "gpt-bench";

async fn per_call<F, Fut>(mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    for _ in 0..ITERATIONS / 10 {
        f().await;
    }
    let start = Instant::now();
    for _ in 0..ITERATIONS {
        f().await;
    }
    start.elapsed() / ITERATIONS
}

fn main() {
    // The proxy takes seconds to import; it starts first.
    let server = ScriptedOpenAi::start();
    let mut litellm = LiteLlm::spawn_forwarding(&[Upstream {
        name: MODEL.into(),
        api_base: server.base_url(),
        api_key: "sk-bench-upstream".into(),
    }]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        data_dir: Some(data.path().join("data")),
        max_instances: 64,
        ..RuntimeConfig::default()
    })
    .unwrap();
    // Both parts run with the proxy up and idle, so its start-up (seconds
    // of a core) is in neither.
    litellm.wait_ready(Duration::from_secs(180));
    rt.block_on(in_process(&runtime));
    rt.block_on(over_http(&runtime, &server, &litellm, data.path()));
}

fn coord() -> Coord {
    let opts = CoordOptions::new(Owner::incarnation("bench"));
    let kv = MemoryKv::new(
        Arc::new(SystemClock),
        &Retentions {
            lease_ttl: opts.lease_ttl,
            status: opts.status_age,
            rate: opts.rate_age,
        },
    );
    Coord::memory(kv, opts)
}

fn site() -> CallSite {
    CallSite {
        turn_id: "t".into(),
        seat: "ada".into(),
        phase: Phase::Executor,
        iteration: 0,
        trace_id: None,
    }
}

fn prompt() -> Prompt {
    Prompt {
        messages: vec![Msg::system(SYSTEM), Msg::user(WAKE)],
        tools: vec![],
        must_call_tool: false,
        max_tokens: 256,
    }
}

fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "dev"
    } else {
        "release or bench"
    }
}

async fn in_process(runtime: &Arc<Runtime>) {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins");
    let manifest = Manifest::load(&plugins.join("providers/scripted/plugin.toml")).unwrap();
    let plugin = Arc::new(ProviderPlugin::load(runtime, manifest).unwrap_or_else(|e| {
        panic!("{e} (build the guests: cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml)")
    }));

    let options = json!({"steps": [{"say": "hello {{wake.handle}}"}]});
    let wit = |role, content: &str| Message {
        role,
        content: content.into(),
        tool_calls: vec![],
        tool_call_id: None,
    };
    let direct = Request {
        base_url: String::new(),
        model: "demo".into(),
        messages: vec![wit(Role::System, SYSTEM), wit(Role::User, WAKE)],
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: 256,
        credential: Credential {
            api_key: String::new(),
        },
        options_json: options.to_string(),
    };

    let models = Models::new(
        crewlet_plugins::Installed::providers_only(vec![plugin.clone()]),
        coord().model_cooldowns(),
        None,
        Resolve::fixed::<&str, &str>([]),
        ModelsOptions::default(),
    )
    .await;
    let chain = [ModelRef {
        provider: "scripted".into(),
        model: "demo".into(),
        credentials: vec![],
        options: match options {
            serde_json::Value::Object(m) => m.into_iter().collect(),
            _ => unreachable!(),
        },
    }];
    let site = site();

    // Alternating rounds, best of each: the machine is shared and noisy,
    // and whichever loop ran first would otherwise pay the warm-up.
    let mut plugin_only = Duration::MAX;
    let mut layered = Duration::MAX;
    for _ in 0..ROUNDS {
        let d = per_call(|| {
            let (p, r) = (plugin.clone(), direct.clone());
            async move {
                let a = p.complete(r).await.unwrap().unwrap();
                assert_eq!(a.text.as_deref(), Some(ANSWER));
            }
        })
        .await;
        plugin_only = plugin_only.min(d);
        let d = per_call(|| {
            let (m, chain, site) = (&models, &chain, &site);
            async move {
                let a = m.call(chain, prompt(), site).await.unwrap();
                assert_eq!(a.thought.text.as_deref(), Some(ANSWER));
            }
        })
        .await;
        layered = layered.min(d);
    }
    models.shutdown().await;

    println!(
        "models ({} profile, best of {ROUNDS} alternating rounds of {ITERATIONS} calls, scripted provider)",
        profile()
    );
    println!("  ProviderPlugin::complete  {plugin_only:>10.2?} per call");
    println!("  Models::call              {layered:>10.2?} per call");
    println!(
        "  overhead                  {:>10.2?} per call, ratio {:.3}×",
        layered.saturating_sub(plugin_only),
        layered.as_secs_f64() / plugin_only.as_secs_f64()
    );
}

/// One way to get a chat completion, and its per-call times.
struct Way {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Way {
    fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        s[((s.len() - 1) as f64 * q).round() as usize]
    }
}

/// Queues one reply per call about to be made: the server answers each
/// model's requests from its queue.
fn queue(server: &ScriptedOpenAi, calls: usize) {
    for _ in 0..calls {
        server.reply(MODEL, Reply::Text(ANSWER.into()));
    }
}

/// Runs `warmup` calls, then `calls` timed ones, checking each answer and
/// that every one reached the server.
async fn timed<F, Fut>(server: &ScriptedOpenAi, calls: usize, mut f: F) -> Vec<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = String>,
{
    queue(server, HTTP_WARMUP + calls);
    let before = server.request_count();
    for _ in 0..HTTP_WARMUP {
        assert_eq!(f().await, ANSWER);
    }
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let text = f().await;
        out.push(start.elapsed());
        assert_eq!(text, ANSWER);
    }
    assert_eq!(
        server.request_count() - before,
        HTTP_WARMUP + calls,
        "every call reached the one server, once"
    );
    out
}

type Http = Client<HttpConnector, Full<Bytes>>;

/// One chat completion by plain HTTP/1.1 on a kept connection: the
/// assistant's text.
async fn post(client: &Http, url: &str, bearer: &str, body: &Bytes) -> String {
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {bearer}"))
        .body(Full::new(body.clone()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let raw = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(status.is_success(), "{status}: {raw:?}");
    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn over_http(runtime: &Arc<Runtime>, server: &ScriptedOpenAi, litellm: &LiteLlm, dir: &Path) {
    let plugins = PluginsDir::new(dir.join("plugins"));
    plugins.add_provider_at(
        "openai",
        "plugins/providers/openai/plugin.toml",
        &server.base_url(),
        &server.origin(),
    );
    let manifest = Manifest::load(&plugins.path().join("openai/plugin.toml")).unwrap();
    let plugin = Arc::new(ProviderPlugin::load(runtime, manifest).unwrap());
    let models = Models::new(
        crewlet_plugins::Installed::providers_only(vec![plugin]),
        coord().model_cooldowns(),
        None,
        Resolve::fixed([("BENCH_KEY", "sk-bench-key")]),
        ModelsOptions::default(),
    )
    .await;
    let chain = [ModelRef {
        provider: "openai".into(),
        model: MODEL.into(),
        credentials: vec![SecretRef::name("BENCH_KEY").unwrap()],
        options: Default::default(),
    }];
    let site = site();

    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let body = Bytes::from(
        json!({
            "model": MODEL,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": WAKE},
            ],
            "max_tokens": 256,
        })
        .to_string(),
    );
    let direct_url = format!("{}/chat/completions", server.base_url());
    let proxy_url = format!("{}/v1/chat/completions", litellm.base_url());

    let mut ways = [
        Way {
            name: "direct HTTP (hyper, kept connection)",
            samples: Vec::new(),
        },
        Way {
            name: "Models::call → OpenAI plugin → wasi:http",
            samples: Vec::new(),
        },
        Way {
            name: "LiteLLM proxy → the same server",
            samples: Vec::new(),
        },
    ];
    // Interleaved rounds: a noisy minute on the shared machine lands on
    // every path, not on whichever ran then.
    for _ in 0..HTTP_ROUNDS {
        let s = timed(server, HTTP_CALLS, || {
            post(&client, &direct_url, "sk-bench-key", &body)
        })
        .await;
        ways[0].samples.extend(s);
        let (m, c, at) = (&models, &chain, &site);
        let s = timed(server, HTTP_CALLS, move || async move {
            let a = m.call(c, prompt(), at).await.unwrap();
            a.thought.text.unwrap_or_default()
        })
        .await;
        ways[1].samples.extend(s);
        let s = timed(server, HTTP_CALLS, || {
            post(&client, &proxy_url, MASTER_KEY, &body)
        })
        .await;
        let last = server.requests_from(server.request_count() - 1);
        assert_eq!(
            last[0].bearer.as_deref(),
            Some("sk-bench-upstream"),
            "the proxy forwarded to the server with its own upstream key"
        );
        ways[2].samples.extend(s);
    }
    models.shutdown().await;

    let base = ways[0].quantile(0.5);
    let base99 = ways[0].quantile(0.99);
    println!(
        "\nmodel layer over HTTP ({} profile, {} interleaved rounds of {HTTP_CALLS} calls per path after {HTTP_WARMUP} warm-up, one local OpenAI-compatible server)",
        profile(),
        HTTP_ROUNDS
    );
    println!(
        "  {:<44} {:>10} {:>10} {:>12} {:>12}",
        "way", "p50", "p99", "p50 ratio", "p50 added"
    );
    for p in &ways {
        let (p50, p99) = (p.quantile(0.5), p.quantile(0.99));
        println!(
            "  {:<44} {:>10.2?} {:>10.2?} {:>11.2}× {:>12.2?}   (p99 {:.2}×)",
            p.name,
            p50,
            p99,
            p50.as_secs_f64() / base.as_secs_f64(),
            p50.saturating_sub(base),
            p99.as_secs_f64() / base99.as_secs_f64()
        );
    }
}
