//! The model layer's own cost: `Models::call` through the scripted provider
//! vs calling the `ProviderPlugin` directly with the same request, printed
//! as per-call times and their ratio. The difference is what the layer adds
//! (resolving keys, leasing, building the request, recording attempts).
//!
//! Coordination is the in-process twin: no call reads it (pulls run on their
//! own clock), so a real server would change nothing measured here.
//!
//! Run: cargo bench -p crewlet-models (after the plugin build).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crewlet_company::ModelRef;
use crewlet_coord::bucket::Retentions;
use crewlet_coord::{Coord, CoordOptions, MemoryKv, Owner, SystemClock};
use crewlet_models::{
    CallSite, Message, ModelRequest, Models, ModelsOptions, Phase, Role, ToolChoice,
};
use crewlet_plugins::manifest::Manifest;
use crewlet_plugins::provider::{Credential, ProviderPlugin, Request};
use crewlet_plugins::runtime::{Runtime, RuntimeConfig};

const ITERATIONS: u32 = 1_000;
const ROUNDS: u32 = 5;

async fn per_call<F, Fut>(mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins");
    let data = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeConfig {
        data_dir: Some(data.path().to_path_buf()),
        max_instances: 64,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let manifest = Manifest::load(&plugins.join("providers/scripted/plugin.toml")).unwrap();
    let plugin = Arc::new(ProviderPlugin::load(&runtime, manifest).unwrap_or_else(|e| {
        panic!("{e} (build the guests: cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml)")
    }));

    let options = serde_json::json!({"steps": [{"say": "hello {{wake.handle}}"}]});
    let messages = vec![
        Message {
            role: Role::System,
            content: "You are ada, a careful engineer.".into(),
            tool_calls: vec![],
            tool_call_id: None,
        },
        Message {
            role: Role::User,
            content: "```wake\n{\"channel\":\"C1\",\"thread\":\"17.1\",\"text\":\"hi\",\"handle\":\"ada\",\"source\":\"slack\"}\n```".into(),
            tool_calls: vec![],
            tool_call_id: None,
        },
    ];
    let direct = Request {
        base_url: String::new(),
        model: "demo".into(),
        messages: messages.clone(),
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: 256,
        credential: Credential {
            api_key: String::new(),
        },
        options_json: options.to_string(),
    };

    let opts = CoordOptions::new(Owner::incarnation("bench"));
    let kv = MemoryKv::new(
        Arc::new(SystemClock),
        &Retentions {
            lease_ttl: opts.lease_ttl,
            status: opts.status_age,
            rate: opts.rate_age,
        },
    );
    let coord = Coord::memory(kv, opts);
    let models = Models::new(
        crewlet_plugins::Installed::providers_only(vec![plugin.clone()]),
        coord,
        None,
        crewlet_models::Resolve::fixed::<&str, &str>([]),
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
    let request = ModelRequest {
        messages,
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: 256,
    };
    let site = CallSite {
        turn_id: "t".into(),
        seat: "ada".into(),
        phase: Phase::Executor,
        iteration: 0,
        trace_id: None,
    };

    // Alternating rounds, best of each: the machine is shared and noisy,
    // and whichever loop ran first would otherwise pay the warm-up.
    let mut plugin_only = Duration::MAX;
    let mut layered = Duration::MAX;
    for _ in 0..ROUNDS {
        let d = per_call(|| {
            let (p, r) = (plugin.clone(), direct.clone());
            async move {
                let a = p.complete(r).await.unwrap().unwrap();
                assert_eq!(a.text.as_deref(), Some("hello ada"));
            }
        })
        .await;
        plugin_only = plugin_only.min(d);
        let d = per_call(|| {
            let (m, r, s) = (&models, request.clone(), site.clone());
            let chain = &chain;
            async move {
                let a = m.call(chain, r, s).await.unwrap();
                assert_eq!(a.completion.text.as_deref(), Some("hello ada"));
            }
        })
        .await;
        layered = layered.min(d);
    }
    models.shutdown().await;

    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    println!(
        "models ({profile} profile, best of {ROUNDS} alternating rounds of {ITERATIONS} calls, scripted provider)"
    );
    println!("  ProviderPlugin::complete  {plugin_only:>10.2?} per call");
    println!("  Models::call              {layered:>10.2?} per call");
    println!(
        "  overhead                  {:>10.2?} per call, ratio {:.3}×",
        layered.saturating_sub(plugin_only),
        layered.as_secs_f64() / plugin_only.as_secs_f64()
    );
}
