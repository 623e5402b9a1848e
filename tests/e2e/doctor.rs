//! `crewlet doctor` through the real binary: what `run` needs, each
//! finding with its fix, exit 1 exactly when `run` would not start.

use std::net::TcpListener;

use serde_json::Value;

use crate::common::company::SCRIPTED_COMPANY;
use crate::common::{self, Sandbox};
use crate::turns;
use crewlet_testkit::nats::nats_server_bin;

pub(crate) fn doctor(
    sb: &Sandbox,
    config: &str,
    company: &str,
    envs: &[(&str, &str)],
) -> (i32, Vec<Value>) {
    let node_toml = sb.path("doctor-node.toml");
    std::fs::write(&node_toml, config).unwrap();
    let company_toml = sb.path("doctor-company.toml");
    std::fs::write(&company_toml, company).unwrap();
    let nats = nats_server_bin();
    let mut all: Vec<(&str, &str)> = vec![("CREWLET_NATS_SERVER", nats.to_str().unwrap())];
    all.extend_from_slice(envs);
    let plugins = sb.path("plugins");
    let data = sb.data_dir();
    // Only the secrets a call passes: `./dev test` exports the example's.
    let (status, out) = common::run_to_exit_without(
        &[
            "doctor",
            "--json",
            "--config",
            node_toml.to_str().unwrap(),
            "--company",
            company_toml.to_str().unwrap(),
            "--plugins",
            plugins.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &all,
        &[
            "SLACK_SIGNING_SECRET",
            "GITHUB_WEBHOOK_SECRET",
            "OPENAI_API_KEY",
        ],
    );
    let json_start = out.find('[').unwrap_or_else(|| panic!("no JSON: {out}"));
    let findings: Vec<Value> =
        serde_json::from_str(out[json_start..].trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    (status.code().unwrap(), findings)
}

pub(crate) fn finding<'a>(findings: &'a [Value], check: &str, needle: &str) -> &'a Value {
    findings
        .iter()
        .find(|f| f["check"] == check && f["detail"].as_str().unwrap().contains(needle))
        .unwrap_or_else(|| panic!("no {check} finding with {needle:?} in {findings:#?}"))
}

#[test]
fn doctor_names_what_run_needs_and_the_fix_for_each() {
    let sb = Sandbox::new();
    turns::plugins(&sb, None);
    let company = SCRIPTED_COMPANY.replace("{chat}", "");
    let free = crewlet_testkit::free_port();

    // Everything in place: exit 0; the one secret present.
    let (code, f) = doctor(
        &sb,
        &format!("[api]\nport = {free}\n"),
        &company,
        &[("SLACK_SIGNING_SECRET", "s")],
    );
    assert_eq!(code, 0, "{f:#?}");
    assert!(f.iter().all(|x| x["verdict"] == "ok"), "{f:#?}");
    assert!(
        finding(&f, "nats-server", "nats-server")["detail"]
            .as_str()
            .unwrap()
            .contains("v2.")
    );
    finding(&f, "plugins", "pass");
    finding(&f, "company", "plugins are all here");
    finding(&f, "secret", "SLACK_SIGNING_SECRET is set");

    // A secret this shell lacks is a warning: the fleet's bucket may hold it.
    let (code, f) = doctor(&sb, &format!("[api]\nport = {free}\n"), &company, &[]);
    assert_eq!(code, 0, "{f:#?}");
    let s = finding(&f, "secret", "SLACK_SIGNING_SECRET");
    assert_eq!(s["verdict"], "warn");
    assert!(
        s["fix"]
            .as_str()
            .unwrap()
            .contains("crewlet secrets set SLACK_SIGNING_SECRET")
    );

    // A taken port and a company naming a plugin nobody has: exit 1, each
    // named with its key.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let misspelt = company.replace("plugin = \"slack\"", "plugin = \"slakc\"");
    let (code, f) = doctor(&sb, &format!("[api]\nport = {port}\n"), &misspelt, &[]);
    assert_eq!(code, 1, "{f:#?}");
    let p = finding(&f, "api port", &port.to_string());
    assert_eq!(p["verdict"], "fail");
    assert!(p["fix"].as_str().unwrap().contains("api.port"));
    let c = finding(&f, "company", "integrations.slack.plugin");
    assert_eq!(c["verdict"], "fail");

    // An external NATS nobody runs.
    let nowhere = crewlet_testkit::free_port();
    let (code, f) = doctor(
        &sb,
        &format!("[api]\nport = {free}\n[stream]\nurl = \"nats://127.0.0.1:{nowhere}\"\n"),
        &company,
        &[("SLACK_SIGNING_SECRET", "s")],
    );
    assert_eq!(code, 1, "{f:#?}");
    let n = finding(&f, "nats", &nowhere.to_string());
    assert_eq!(n["verdict"], "fail");
    assert!(n["fix"].as_str().unwrap().contains("stream.url"));

    // A configuration key it refuses stops it at once, naming the key.
    let (code, f) = doctor(&sb, "[api]\nport = \"seven\"\n", &company, &[]);
    assert_eq!(code, 1);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert!(f[0]["detail"].as_str().unwrap().contains("port"), "{f:#?}");
}
