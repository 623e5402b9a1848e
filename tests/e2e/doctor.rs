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

/// The doctor's findings of `check` whose detail holds `needle`.
fn findings<'a>(findings: &'a [Value], check: &str, needle: &str) -> Vec<&'a Value> {
    findings
        .iter()
        .filter(|f| f["check"] == check && f["detail"].as_str().unwrap().contains(needle))
        .collect()
}

#[test]
fn doctor_checks_each_seats_mcp_server_command_and_credentials() {
    let sb = Sandbox::new();
    turns::plugins(&sb, None);
    let free = crewlet_testkit::free_port();
    let config = format!("[api]\nport = {free}\n");
    let server = r#"
[roles.support.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = { CHAT_IDENTITY = "${CREWLET_SEAT}", CHAT_TOKEN = "${CHAT_TOKEN}" }
replies = ["post_message"]
"#;
    let seats = "ada = { role = \"support\", credentials = { CHAT_TOKEN = \"${ADA_CHAT_TOKEN}\" } }\n\
                 grace = { role = \"support\", credentials = { CHAT_TOKEN = \"${GRACE_CHAT_TOKEN}\" } }\n";
    let company = SCRIPTED_COMPANY
        .replace("{chat}", server)
        .replace("ada = { role = \"support\" }\n", seats);
    let (code, f) = doctor(
        &sb,
        &config,
        &company,
        &[("SLACK_SIGNING_SECRET", "s"), ("ADA_CHAT_TOKEN", "t")],
    );
    assert_eq!(
        code, 0,
        "a credential not in this shell is a warning: {f:#?}"
    );
    let command = finding(&f, "mcp", "seats ada, grace: `chat` runs");
    assert_eq!(command["verdict"], "ok", "{command}");
    let ada = finding(
        &f,
        "mcp",
        "seat ada: `chat`'s CHAT_TOKEN (its credential ADA_CHAT_TOKEN)",
    );
    assert_eq!(ada["verdict"], "ok", "{ada}");
    let grace = finding(&f, "mcp", "seat grace: `chat` needs CHAT_TOKEN");
    assert_eq!(grace["verdict"], "warn", "{grace}");
    assert!(
        grace["fix"]
            .as_str()
            .unwrap()
            .contains("crewlet secrets set GRACE_CHAT_TOKEN"),
        "{grace}"
    );
    assert!(
        findings(&f, "mcp", "CREWLET_SEAT").is_empty(),
        "the node's own names are no secrets: {f:#?}"
    );

    // The Slack recipe as shipped, on a node without its install: `run`
    // would refuse the company, and each seat's server is named.
    crewlet_testkit::PluginsDir::new(sb.path("plugins"))
        .add("openai", "plugins/providers/openai/plugin.toml");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let recipe =
        |name: &str| std::fs::read_to_string(root.join("docs/recipes").join(name)).unwrap();
    const PREFIX: &str = "/opt/crewlet-mcp";
    let absent = sb.path("no-such-install");
    let (code, f) = doctor(
        &sb,
        &format!(
            "{config}{}",
            recipe("node.toml").replace(PREFIX, absent.to_str().unwrap())
        ),
        &recipe("slack.toml").replace(PREFIX, absent.to_str().unwrap()),
        &[],
    );
    assert_eq!(code, 1, "{f:#?}");
    let missing = finding(
        &f,
        "mcp",
        "seats ada, grace: `slack` (roles.support.mcp.slack.command)",
    );
    assert_eq!(missing["verdict"], "fail", "{missing}");
    assert!(
        missing["detail"]
            .as_str()
            .unwrap()
            .contains("cannot be run here"),
        "{missing}"
    );
    assert!(
        missing["fix"].as_str().unwrap().contains("docs/recipes.md"),
        "{missing}"
    );

    // Installed (this repository's tests/mcp-servers), but the node's file
    // allows only its own servers: the fix names the line to add.
    let installed = sb.path("crewlet-mcp");
    std::fs::create_dir_all(&installed).unwrap();
    std::os::unix::fs::symlink(
        root.join("tests/mcp-servers/node_modules"),
        installed.join("node_modules"),
    )
    .unwrap();
    let slack = recipe("slack.toml").replace(PREFIX, installed.to_str().unwrap());
    let (code, f) = doctor(&sb, &config, &slack, &[]);
    assert_eq!(code, 1, "{f:#?}");
    let refused = finding(&f, "mcp", "seats ada, grace: `slack`");
    assert_eq!(refused["verdict"], "fail", "{refused}");
    assert!(
        refused["fix"]
            .as_str()
            .unwrap()
            .contains("to [mcp] allowed_commands"),
        "{refused}"
    );

    // With node.toml's allow-list: the command is fine, and each seat's
    // own token is named, known or not.
    let node = recipe("node.toml").replace(PREFIX, installed.to_str().unwrap());
    let (code, f) = doctor(
        &sb,
        &format!("{config}{node}"),
        &slack,
        &[
            ("SLACK_SIGNING_SECRET", "s"),
            ("GRACE_SLACK_BOT_TOKEN", "xoxb-g"),
        ],
    );
    assert_eq!(code, 0, "{f:#?}");
    let allowed = finding(&f, "mcp", "seats ada, grace: `slack` runs");
    assert_eq!(allowed["verdict"], "ok", "{allowed}");
    let ada = finding(
        &f,
        "mcp",
        "seat ada: `slack` needs SLACK_BOT_TOKEN (its credential ADA_SLACK_BOT_TOKEN)",
    );
    assert_eq!(ada["verdict"], "warn", "{ada}");
    let grace = finding(
        &f,
        "mcp",
        "seat grace: `slack`'s SLACK_BOT_TOKEN (its credential GRACE_SLACK_BOT_TOKEN) is set",
    );
    assert_eq!(grace["verdict"], "ok", "{grace}");
}
