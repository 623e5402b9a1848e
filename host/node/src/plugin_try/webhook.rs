//! A webhook plugin's trial: a captured request (one a node recorded when
//! it refused it, or one written by hand) through verify, then parse, then
//! the host's bounds. The secrets the manifest declares come from the
//! environment, under their names or upper-cased (`slack_signing_secret`
//! from `SLACK_SIGNING_SECRET`). Exit 0 when the delivery would be
//! accepted.

use crewlet_plugins::Manifest;
use crewlet_plugins::trial::{Capture, WebhookTrial};
use crewlet_plugins::webhook::{Delivery, Wakes, WebhookPlugin};
use serde_json::{Value, json};

use super::{Engine, Trial, failed};

const EXPECTED: &str = "a captured request (route, headers, body_base64, received_unix), as a node records with [ingress] record_refused";

pub(super) async fn run(engine: &Engine, manifest: Manifest, request: &Trial<'_>) -> i32 {
    let capture: Capture = match request.read(EXPECTED) {
        Ok(c) => c,
        Err(status) => return status,
    };
    let plugin = match WebhookPlugin::load(engine, manifest.clone()) {
        Ok(p) => p,
        Err(e) => return failed(&manifest, e),
    };
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
    let req = match capture.request(&secrets) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("crewlet: {}: {e}", request.file.display());
            return 2;
        }
    };
    match plugin.trial(req).await {
        Ok(trial) => {
            let accepted = matches!(
                (&trial.verify, &trial.parse, &trial.bounds),
                (Ok(()), Some(Ok(_)), Some(Ok(())))
            );
            request.print(&view(&trial), render, if accepted { 0 } else { 1 })
        }
        Err(e) => failed(&manifest, e),
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
        "owed": d.owed.as_ref().map(|o| json!({"channel": o.channel, "thread": o.thread})),
        "text": d.text,
        "payload_bytes": d.payload.len(),
        "sender": d.sender,
        "wakes": match &d.wakes {
            Wakes::RouteAndNamed => json!("route-and-named"),
            Wakes::Named => json!("named"),
            Wakes::Nobody(why) => json!({ "nobody": why }),
        },
    })
}

/// The trial as JSON: each step's word, the deliveries, the plugin's
/// stderr. Refusals are the host's sentences (no secret of the call).
fn view(t: &WebhookTrial) -> Value {
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
        "plugin_logged": t.logged,
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
    out.push_str(&super::spoken(v));
    out
}
