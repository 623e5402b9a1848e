//! What an operator sees of the plugins: `GET /plugins` (and `crewlet
//! plugins list --api`), with each permission's provenance (`effective`:
//! manifest, operator added, operator denied) and, for a plugin whose
//! newest version was refused, why the older one serves.

use serde_json::{Value, json};

use crewlet_plugins::effective;
use crewlet_plugins::manifest::Permissions;
use crewlet_plugins::{HealthReport, Manifest, Plugin};

use super::{Loaded, ModuleState, USAGE_WITHIN};

/// What a plugin may touch, one line per permission; what the operator's
/// configuration added or denied says so (the lines an operator's grant
/// can change are [`effective::rows`], as `effective` carries them).
pub fn permissions(m: &Manifest) -> Vec<String> {
    let lines = effective::lines(m);
    let line = |kind: &str| -> Vec<String> {
        let of_kind = lines.iter().filter(|(k, _)| *k == kind);
        of_kind.map(|(_, line)| line.clone()).collect()
    };
    let mut out = vec![format!(
        "memory {} MiB, {} ms per call",
        m.limits.memory_bytes / (1024 * 1024),
        m.limits.deadline.as_millis()
    )];
    if m.scratch {
        out.push("a private scratch directory".into());
    }
    match &m.permissions {
        Permissions::Webhook { secrets, .. } => {
            out.extend(line("route"));
            out.extend(secrets.iter().map(|s| format!("secret {s}")));
            out.extend(line("body_limit"));
        }
        Permissions::Provider { .. } => {
            out.extend(line("base_url"));
            out.extend(line("outbound"));
        }
        Permissions::Module { state, .. } => {
            out.extend(state.iter().map(|b| format!("owns bucket {}", b.local)));
            out.extend(line("read"));
        }
    }
    out
}

impl Loaded {
    /// The body of `GET /plugins`.
    pub fn view(&self) -> Value {
        let entry = |m: &Manifest, health: HealthReport| {
            json!({
                "name": m.name,
                "version": m.version,
                "kind": m.kind.world(),
                "manifest": m.file.display().to_string(),
                "permissions": permissions(m),
                "effective": effective::rows(m),
                "degraded": health.degraded,
                "breaker": {
                    "state": health.breaker,
                    "retry_after_ms": health.retry_after.map(|d| d.as_millis() as u64),
                    "faults_in_window": health.faults_in_window,
                },
                "calls": health.total_calls,
                "faults": health.total_faults,
                "host_faults": health.host_faults,
                "refused": health.refused_calls,
                "consecutive_faults": health.consecutive_faults,
                "last_fault": health.last_fault,
                "last_fault_kind": health.last_fault_kind,
            })
        };
        let states = self
            .module_states
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let refusals = self.installed.refusals();
        let mut plugins: Vec<Value> = Vec::new();
        let serving = self.installed.all();
        plugins.extend(
            serving
                .iter()
                .filter(|p| !matches!(p, Plugin::Module(_)))
                .map(|p| entry(p.manifest(), p.health())),
        );
        let modules = self.installed.modules();
        plugins.extend(modules.iter().map(|p| {
            let mut e = entry(p.manifest(), p.health());
            let (state, error) = match states.get(&p.manifest().name) {
                Some(ModuleState::Running) => ("running", None),
                Some(ModuleState::Failed(why)) => ("failed", Some(why.clone())),
                Some(ModuleState::Starting) | None => ("starting", None),
            };
            e["state"] = json!(state);
            if let (Value::Object(entry), Value::Object(more)) =
                (&mut e, crate::modules::view(p, &self.board))
            {
                entry.extend(more);
            }
            e["error"] = json!(error);
            e["watches"] = p
                .watches()
                .iter()
                .map(|w| {
                    json!({
                        "id": w.id,
                        "bucket": w.bucket,
                        "state": w.state.as_str(),
                        "attempts": w.attempts,
                        "reopened": w.reopened,
                        "last_error": w.last_error,
                    })
                })
                .collect::<Vec<_>>()
                .into();
            e
        }));
        for p in &mut plugins {
            let name = p["name"].as_str().unwrap_or_default().to_string();
            p["reloads"] = json!(self.installed.reloads(&name));
            p["reload_refused"] = match refusals.get(&name) {
                Some(r) => json!({ "reason": r.reason, "at_ms": r.at_ms }),
                None => Value::Null,
            };
        }
        json!({
            "plugins": plugins,
            "failed": self.failed().iter().map(|(name, error)| json!({ "name": name, "error": error })).collect::<Vec<_>>(),
            "orphaned_buckets": self.orphaned,
            "buckets": self.buckets.iter().map(|b| json!({
                "name": b.name,
                "created": b.created,
                "reconfigured": b.reconfigured,
                "replicas": b.replicas,
                "configured_replicas": b.wanted_replicas,
                "replicas_differ": b.replicas_differ(),
            })).collect::<Vec<_>>(),
        })
    }

    /// [`Loaded::view`] with what each module bucket holds, read now: live
    /// keys (a certified listing), bytes and cap. Each read is bounded by
    /// [`USAGE_WITHIN`]; a bucket that does not answer says so in its row.
    pub async fn view_with_usage(&self) -> Value {
        let mut view = self.view();
        let reads = self.buckets.iter().map(|b| {
            let state = self.state.clone();
            let name = b.name.clone();
            async move { tokio::time::timeout(USAGE_WITHIN, state.usage(&name)).await }
        });
        let usages = futures::future::join_all(reads).await;
        if let Some(rows) = view["buckets"].as_array_mut() {
            for (row, usage) in rows.iter_mut().zip(usages) {
                match usage {
                    Ok(Ok(u)) => {
                        row["keys"] = json!(u.keys);
                        row["bytes"] = json!(u.bytes);
                        row["max_bytes"] = json!(u.max_bytes);
                    }
                    Ok(Err(e)) => row["usage_error"] = json!(e.to_string()),
                    Err(_) => {
                        row["usage_error"] = json!(format!(
                            "the bus did not answer within {} s; ask again",
                            USAGE_WITHIN.as_secs()
                        ))
                    }
                }
            }
        }
        view
    }
}

/// `crewlet plugins list --api URL --effective`: each plugin's permissions
/// the running node reports, with where each came from.
pub fn render_effective(view: &Value) -> String {
    let plugins = view["plugins"].as_array().into_iter().flatten();
    let rows: Vec<effective::PluginRows> = plugins
        .filter_map(|p| serde_json::from_value(p.clone()).ok())
        .collect();
    effective::render(&rows)
}

/// `crewlet plugins list --api URL`: what the running node reports, one
/// block per plugin (health; a module's subscriptions, tools and
/// publications), then every module bucket with what it holds.
pub fn render_live(view: &Value) -> String {
    let mut out = String::new();
    for p in view["plugins"].as_array().into_iter().flatten() {
        let s = |k: &str| p[k].as_str().unwrap_or("-").to_owned();
        let state = p["state"].as_str().unwrap_or("loaded");
        let degraded = if p["degraded"].as_bool() == Some(true) {
            " DEGRADED"
        } else {
            ""
        };
        out.push_str(&format!(
            "{} {} ({}) {state}{degraded}: calls {}, faults {}, breaker {}\n",
            s("name"),
            s("version"),
            s("kind"),
            p["calls"],
            p["faults"],
            p["breaker"]["state"].as_str().unwrap_or("-"),
        ));
        if let Some(why) = p["reload_refused"]["reason"].as_str() {
            out.push_str(&format!(
                "  newest version REFUSED, this one keeps serving: {why}\n"
            ));
        }
        if let Some(subs) = p["subscriptions"].as_object() {
            for (kind, sub) in subs {
                out.push_str(&format!(
                    "  subscribes {kind} ({})\n",
                    sub["delivery"].as_str().unwrap_or("-")
                ));
            }
        }
        for t in p["tools"].as_array().into_iter().flatten() {
            out.push_str(&format!(
                "  tool {}\n",
                t["offered_as"].as_str().unwrap_or("-")
            ));
        }
        for kind in p["publishes"].as_array().into_iter().flatten() {
            out.push_str(&format!("  publishes {}\n", kind.as_str().unwrap_or("-")));
        }
    }
    for b in view["buckets"].as_array().into_iter().flatten() {
        let name = b["name"].as_str().unwrap_or("-");
        let held = match b["usage_error"].as_str() {
            Some(e) => format!("usage unknown: {e}"),
            None => format!(
                "{} keys, {} bytes of {}",
                b["keys"],
                b["bytes"],
                b["max_bytes"]
                    .as_u64()
                    .map(|m| format!("{m}"))
                    .unwrap_or_else(|| "no cap".into())
            ),
        };
        out.push_str(&format!("bucket {name}: {held}, R{}\n", b["replicas"]));
    }
    for f in view["failed"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "FAILED {}: {}\n",
            f["name"].as_str().unwrap_or("-"),
            f["error"].as_str().unwrap_or("-")
        ));
    }
    out
}
