//! Who a plugin's failure is charged to, through the real binary: a
//! provider whose vendor answers only past the plugin's deadline fails
//! every call, but each failure is the host's (the guest was waiting on
//! the vendor in a host call), so the plugin's breaker never opens however
//! many there are — every call still reaches the vendor. A guest spinning
//! in its own code is quarantined after five: `sandbox.rs`.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::turns::{self, KEYS, OPENAI_COMPANY};
use crewlet_testkit::openai::Reply;
use crewlet_testkit::{PluginsDir, ScriptedOpenAi};

/// The provider's deadline; the vendor answers after three times it.
const DEADLINE_MS: u64 = 1_000;

#[test]
fn a_vendor_slower_than_the_deadline_never_quarantines_its_provider() {
    let ai = ScriptedOpenAi::start();
    for model in ["exec-a", "exec-b"] {
        for _ in 0..12 {
            ai.reply(
                model,
                Reply::Delayed(
                    Duration::from_millis(3 * DEADLINE_MS),
                    Box::new(Reply::Text("too late".into())),
                ),
            );
        }
    }
    let grant = format!(
        "[plugins.grants.openai]\nbase_url = \"{}\"\n",
        ai.base_url()
    );
    let w = turns::start_custom(OPENAI_COMPANY, KEYS, &grant, |sb| {
        PluginsDir::new(sb.path("plugins"))
            .add("slack", "plugins/webhooks/slack/plugin.toml")
            .add_with_deadline(
                "openai",
                "plugins/providers/openai/plugin.toml",
                DEADLINE_MS,
            );
    });
    // Each turn tries both executor models once: six calls cut at their
    // deadline, past the five that open a breaker on the guest's faults.
    for (i, seat) in ["ada", "bob", "ada"].iter().enumerate() {
        w.mention(
            seat,
            &format!("EvB{i}"),
            "C1",
            &format!("{i}.1"),
            &format!("<@{seat}> hello?"),
        );
    }
    let view = wait_for_host_faults(&w, 6);
    assert_eq!(view["breaker"]["state"], "closed", "{view}");
    assert_eq!(view["faults"], 0, "{view}");
    assert_eq!(view["last_fault_kind"], Value::Null, "{view}");
    assert!(
        ai.request_count() >= 6,
        "every call reached the vendor: {} requests",
        ai.request_count()
    );
}

/// The OpenAI plugin's row of `GET /plugins` once it counts at least `n`
/// failures blamed on the host (within a generous bound).
fn wait_for_host_faults(w: &turns::World, n: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let view = w.node.get("/plugins").unwrap().json();
        let openai = view["plugins"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == "openai"))
            .cloned()
            .unwrap_or(Value::Null);
        if openai["host_faults"].as_u64().unwrap_or(0) >= n {
            return openai;
        }
        assert!(
            Instant::now() < deadline,
            "fewer than {n} host faults: {openai}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
