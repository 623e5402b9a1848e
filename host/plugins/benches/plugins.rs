//! Plugin host figures, printed as ratios measured in one run:
//! - GitHub parse of a ~15 KB payload in WASM (warm instance) vs the same
//!   code natively (goal ≤ 2.5×);
//! - pooled instantiate, and instantiate + call (goal ≤ 15 µs instantiate);
//! - loading every repo plugin: compile vs cold load from the artifact cache.
//!
//! Run: cargo bench -p crewlet-plugins (after the plugin build).

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use crewlet_plugins::catalogue::Catalogue;
use crewlet_plugins::runtime::{CacheOutcome, Runtime, RuntimeConfig};
use crewlet_plugins::webhook::{Request, WebhookPlugin};
use crewlet_webhook_core::Input;

fn github_payload(target: usize) -> Vec<u8> {
    let user = |login: &str| {
        serde_json::json!({"login": login, "id": 1234567, "node_id": "MDQ6VXNlcjEyMzQ1Njc=",
            "avatar_url": "https://avatars.githubusercontent.com/u/1234567?v=4", "type": "User", "site_admin": false,
            "html_url": format!("https://github.com/{login}"), "url": format!("https://api.github.com/users/{login}")})
    };
    let mut comment =
        String::from("@crew-bot could you look at this regression? cc @ada @bob.\n\n");
    let mut labels = Vec::new();
    for i in 0..12 {
        labels.push(serde_json::json!({"id": 1000 + i, "name": format!("label-{i}"), "color": "ededed", "default": false,
            "description": "A label describing an aspect of the issue in a few words"}));
    }
    let mut payload = serde_json::json!({
        "action": "created",
        "issue": {"number": 4242, "title": "Parser regression on large payloads", "state": "open", "locked": false,
            "user": user("ada"), "labels": labels, "assignees": [user("ada"), user("bob")], "assignee": user("ada"),
            "comments": 17, "created_at": "2026-11-01T10:00:00Z", "updated_at": "2026-11-30T10:00:00Z",
            "body": "Steps to reproduce:\n1. send a large payload\n2. observe the parse time\n".repeat(20)},
        "comment": {"id": 99887766, "user": user("carol"), "created_at": "2026-11-30T10:00:00Z", "body": ""},
        "repository": {"id": 55, "name": "app", "full_name": "acme/app", "private": true, "owner": user("acme"),
            "description": "The application", "default_branch": "main", "topics": ["rust", "wasm", "webhooks"]},
        "sender": user("carol"),
    });
    while payload.to_string().len() < target {
        comment.push_str("Here is another line of the discussion with some `code` and a link https://example.com/x. ");
        payload["comment"]["body"] = serde_json::Value::String(comment.clone());
    }
    payload.to_string().into_bytes()
}

fn per_call<F: FnMut()>(iterations: u32, mut f: F) -> Duration {
    for _ in 0..iterations / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed() / iterations
}

async fn per_call_async<F, Fut>(iterations: u32, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..iterations / 10 {
        f().await;
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f().await;
    }
    start.elapsed() / iterations
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (catalogue, _) = Catalogue::load(&plugins).expect("plugins dir");
        let data = tempfile::tempdir().unwrap();
        let config = RuntimeConfig { data_dir: Some(data.path().to_path_buf()), max_instances: 64, ..RuntimeConfig::default() };
        let runtime = Runtime::new(config.clone()).unwrap();
        let github_manifest = catalogue.get("github").expect("github plugin").clone();
        assert!(
            github_manifest.component.is_file(),
            "build the plugins first: cargo build --release --target wasm32-wasip2 --manifest-path plugins/Cargo.toml"
        );
        let github = WebhookPlugin::load(&runtime, github_manifest).unwrap();

        // 1. ~15 KB GitHub parse, WASM (warm instance) vs native.
        let body = github_payload(15 * 1024);
        let headers = [("x-github-event", "issue_comment"), ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")];
        let req = Request::new("/webhooks/github", &headers, &body, &[], 0);
        let native = per_call(3000, || {
            let input = Input { route: "/webhooks/github", headers: &headers, body: &body, secrets: &[], now_unix_seconds: 0 };
            black_box(crewlet_webhook_core::github::parse(black_box(&input)).unwrap());
        });
        let wasm = per_call_async(3000, || async {
            black_box(github.parse(&req).await.unwrap().unwrap());
        })
        .await;

        // 2. Pooled instantiate, and instantiate + call (small request).
        let small = Request::new("/webhooks/github", &[("x-hub-signature-256", "sha256=00")], b"{}", &[("github_webhook_secret", b"s")], 0);
        let instantiate = per_call_async(2000, || async { github.instantiate_fresh().await.unwrap() }).await;
        let fresh_call = per_call_async(2000, || async {
            github.drop_idle();
            black_box(github.verify(&small).await.unwrap().unwrap_err());
        })
        .await;
        let warm_call = per_call_async(5000, || async {
            black_box(github.verify(&small).await.unwrap().unwrap_err());
        })
        .await;

        // 3. Every plugin: compile (empty cache) vs cold load from the cache
        //    in a fresh engine.
        let loadable: Vec<_> = catalogue.plugins.iter().filter(|m| m.name != "wrong-world").cloned().collect();
        let cold_dir = tempfile::tempdir().unwrap();
        let cold = RuntimeConfig { data_dir: Some(cold_dir.path().to_path_buf()), max_instances: 8, ..RuntimeConfig::default() };
        let compiling = Runtime::new(cold.clone()).unwrap();
        let start = Instant::now();
        for m in &loadable {
            assert_eq!(compiling.load_component(m).unwrap().1, CacheOutcome::Compiled);
        }
        let compile_all = start.elapsed();
        drop(compiling);
        let fresh_engine = Runtime::new(cold).unwrap();
        let start = Instant::now();
        for m in &loadable {
            assert_eq!(fresh_engine.load_component(m).unwrap().1, CacheOutcome::Hit);
        }
        let cached_all = start.elapsed();

        let ratio = wasm.as_secs_f64() / native.as_secs_f64();
        println!("plugin host benchmark ({} B GitHub payload, {} plugins)", body.len(), loadable.len());
        println!("  github parse, native            {:>10}", us(native));
        println!("  github parse, wasm warm         {:>10}   {ratio:.2}x native (goal <= 2.5x)", us(wasm));
        println!("  pooled instantiate              {:>10}   (goal <= 15 us)", us(instantiate));
        println!("  instantiate + verify call       {:>10}", us(fresh_call));
        println!("  verify call, warm instance      {:>10}", us(warm_call));
        println!("  load all plugins, compiling     {:>10.1} ms", compile_all.as_secs_f64() * 1e3);
        println!(
            "  load all plugins, from cache    {:>10.1} ms   {:.0}x faster than compiling",
            cached_all.as_secs_f64() * 1e3,
            compile_all.as_secs_f64() / cached_all.as_secs_f64()
        );
    });
}
