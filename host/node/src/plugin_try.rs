//! `crewlet plugins try NAME --request FILE`: a captured request (one a
//! node recorded when it refused it, or one written by hand) run through a
//! webhook plugin offline — verify, then parse, then the host's bounds —
//! printed with what the plugin wrote to stderr. The secrets the manifest
//! declares come from the environment, under their names or upper-cased
//! (`slack_signing_secret` from `SLACK_SIGNING_SECRET`). Exit 0 when the
//! delivery would be accepted, 1 when it would be refused or the plugin
//! faulted, 2 when the request or plugin is wrong.

use std::path::{Path, PathBuf};

use crewlet_plugins::trial::{Capture, WebhookTrial};
use crewlet_plugins::webhook::{Delivery, WebhookPlugin};
use crewlet_plugins::{Catalogue, Kind, Runtime, RuntimeConfig};
use serde_json::{Value, json};

/// Runs the trial and prints it; answers the exit status.
pub fn try_plugin(name: &str, request: &Path, dirs: &[PathBuf], json: bool) -> i32 {
    let capture: Capture = match std::fs::read(request)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "crewlet: {}: {e}; expected a captured request (route, headers, body_base64, received_unix), as a node records with [ingress] record_refused",
                request.display()
            );
            return 2;
        }
    };
    let manifest = match Catalogue::load_dirs(dirs) {
        Ok((catalogue, _)) => catalogue.plugins.into_iter().find(|m| m.name == name),
        Err(e) => {
            eprintln!("crewlet: {e}");
            return 2;
        }
    };
    let Some(manifest) = manifest else {
        eprintln!(
            "crewlet: no plugin named {name:?} in {dirs:?}; `crewlet plugins list` names them"
        );
        return 2;
    };
    if manifest.kind != Kind::Webhook {
        eprintln!(
            "crewlet: {name} is a {} plugin; `plugins try` runs captured requests through webhook plugins",
            manifest.kind.world()
        );
        return 2;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crewlet: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let outcome = runtime.block_on(async {
        let engine = Runtime::new(RuntimeConfig {
            data_dir: None,
            max_instances: 4,
            ..RuntimeConfig::default()
        })
        .map_err(|e| e.to_string())?;
        let plugin = WebhookPlugin::load(&engine, manifest).map_err(|e| e.to_string())?;
        let values: Vec<(String, Vec<u8>)> = plugin
            .secret_names()
            .iter()
            .filter_map(|n| {
                std::env::var(n)
                    .or_else(|_| std::env::var(n.to_ascii_uppercase()))
                    .ok()
                    .map(|v| (n.clone(), v.into_bytes()))
            })
            .collect();
        let secrets: Vec<(&str, &[u8])> = values
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        let req = capture.request(&secrets)?;
        plugin.trial(req).await.map_err(|e| e.to_string())
    });
    match outcome {
        Ok(trial) => {
            let accepted = matches!(
                (&trial.verify, &trial.parse, &trial.bounds),
                (Ok(()), Some(Ok(_)), Some(Ok(())))
            );
            let view = view(&trial);
            if json {
                println!("{view:#}");
            } else {
                print!("{}", render(&view));
            }
            if accepted { 0 } else { 1 }
        }
        Err(e) => {
            eprintln!("crewlet: {name}: {e}");
            1
        }
    }
}

fn delivery(d: &Delivery) -> Value {
    json!({
        "source": d.source,
        "event_type": d.event_type,
        "delivery_id": d.delivery_id,
        "mentions": d.addressed.mentions,
        "assignees": d.addressed.assignees,
        "reviewers": d.addressed.reviewers,
        "channel": d.addressed.channel,
        "thread": d.addressed.thread,
        "text": d.text,
        "payload_bytes": d.payload.len(),
    })
}

/// The trial as JSON: each step's word, the deliveries, the plugin's
/// stderr. Refusals are the host's sentences (no secret of the call).
pub fn view(t: &WebhookTrial) -> Value {
    let none = crewlet_plugins::scrub::Scrub::of(std::iter::empty::<&[u8]>());
    json!({
        "verify": match &t.verify {
            Ok(()) => json!("ok"),
            Err(e) => json!({"refused": e.sentence(&none)}),
        },
        "parse": match &t.parse {
            None => Value::Null,
            Some(Ok(p)) => json!({"deliveries": p.deliveries.iter().map(delivery).collect::<Vec<_>>()}),
            Some(Err(e)) => json!({"refused": e.sentence(&none)}),
        },
        "bounds": match &t.bounds {
            None => Value::Null,
            Some(Ok(())) => json!("ok"),
            Some(Err(e)) => json!({"refused": e.to_string()}),
        },
        "plugin_said": t.said,
    })
}

fn render(v: &Value) -> String {
    let step = |s: &Value| match s {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.contains_key("refused") => {
            format!("refused: {}", o["refused"].as_str().unwrap_or(""))
        }
        Value::Null => "not run".to_string(),
        other => other.to_string(),
    };
    let mut out = format!("verify: {}\n", step(&v["verify"]));
    match v["parse"].get("deliveries").and_then(Value::as_array) {
        Some(ds) => {
            out.push_str(&format!("parse: {} delivery(ies)\n", ds.len()));
            for d in ds {
                out.push_str(&format!("  {d}\n"));
            }
        }
        None => out.push_str(&format!("parse: {}\n", step(&v["parse"]))),
    }
    out.push_str(&format!("bounds: {}\n", step(&v["bounds"])));
    let said = v["plugin_said"].as_str().unwrap_or("");
    if !said.is_empty() {
        out.push_str(&format!("plugin said: {said}\n"));
    }
    out
}
