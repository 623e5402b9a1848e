//! The recipes of docs/recipes/ run by the real binary: a node started with
//! a recipe's company and node.toml's `[mcp]` section, as shipped (their
//! install prefix pointed at this repository's installs of the same pinned
//! packages), starts one child of the surface's server per seat, each
//! holding that seat's own token and no other's. No vendor is reached: the
//! servers start offline and the tokens are fake.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::common::{self, Node, Sandbox};

/// Where docs/recipes.md installs the servers; the recipes name it.
const PREFIX: &str = "/opt/crewlet-mcp";

/// The secrets every recipe's company names, each a fake value naming it.
const SECRETS: [&str; 11] = [
    "ADA_SLACK_BOT_TOKEN",
    "GRACE_SLACK_BOT_TOKEN",
    "ADA_GITHUB_TOKEN",
    "GRACE_GITHUB_TOKEN",
    "ADA_JIRA_EMAIL",
    "ADA_JIRA_API_TOKEN",
    "GRACE_JIRA_EMAIL",
    "GRACE_JIRA_API_TOKEN",
    "GITHUB_WEBHOOK_SECRET",
    "JIRA_WEBHOOK_SECRET",
    "OPENAI_API_KEY",
];

fn fake(secret: &str) -> String {
    format!("fake-{secret}")
}

/// A stand-in for the recipes' install prefix: links to this repository's
/// installs (scripts/bootstrap.sh makes both).
fn installs(sb: &Sandbox, root: &Path) -> String {
    let prefix = sb.path("crewlet-mcp");
    std::fs::create_dir_all(&prefix).unwrap();
    for (name, target) in [
        ("node_modules", root.join("tests/mcp-servers/node_modules")),
        ("atlassian", root.join(".tools/mcp-atlassian-venv")),
    ] {
        assert!(
            target.is_dir(),
            "{} is missing: install the recipes' servers with `./dev test`",
            target.display()
        );
        std::os::unix::fs::symlink(target, prefix.join(name)).unwrap();
    }
    prefix.display().to_string()
}

/// `var` in the environment of each child of `node` that has it.
fn children_with(node: &Node, var: &str) -> BTreeSet<String> {
    common::children(node.pid())
        .into_iter()
        .filter_map(|pid| std::fs::read(format!("/proc/{pid}/environ")).ok())
        .filter_map(|raw| {
            raw.split(|b| *b == 0)
                .map(String::from_utf8_lossy)
                .find_map(|kv| kv.strip_prefix(&format!("{var}=")).map(str::to_owned))
        })
        .collect()
}

/// Starts a node with the recipe `file` and waits until its `server` runs
/// for both seats, each child holding the seat's own `var`.
fn runs_per_seat(file: &str, server: &str, var: &str, own: [&str; 2]) {
    let sb = Sandbox::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let prefix = installs(&sb, root);
    let shipped = |name: &str| {
        std::fs::read_to_string(root.join("docs/recipes").join(name))
            .unwrap()
            .replace(PREFIX, &prefix)
    };
    let company = sb.path("company.toml");
    std::fs::write(&company, shipped(file)).unwrap();
    let plugins = crewlet_testkit::PluginsDir::new(sb.path("plugins"));
    plugins
        .add("openai", "plugins/providers/openai/plugin.toml")
        .add("slack", "plugins/webhooks/slack/plugin.toml")
        .add("github", "plugins/webhooks/github/plugin.toml")
        .add("atlassian", "plugins/webhooks/atlassian/plugin.toml");
    let mut b = sb
        .node(&shipped("node.toml"))
        .arg("--company")
        .arg(&company)
        .arg("--plugins")
        .arg(plugins.path())
        .env("SLACK_SIGNING_SECRET", "s");
    let values: Vec<(&str, String)> = SECRETS.iter().map(|s| (*s, fake(s))).collect();
    for (k, v) in &values {
        b = b.env(k, v);
    }
    let mut node = b.spawn();
    node.wait_ready(Duration::from_secs(60));
    let row = |node: &Node| {
        node.health()["mcp"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["server"] == server).cloned())
    };
    assert!(
        common::eventually(Duration::from_secs(90), || row(&node)
            .is_some_and(|r| r["started"].as_u64() >= Some(2))),
        "{file}: `{server}` did not start for both seats: {}",
        node.health()
    );
    let row = row(&node).unwrap();
    assert_eq!(row["failed"], 0, "{file}: {row}");
    let expected: BTreeSet<String> = own.iter().map(|s| fake(s)).collect();
    assert_eq!(
        children_with(&node, var),
        expected,
        "{file}: one `{server}` child per seat, each with its own {var}"
    );
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(30)).code(), Some(0));
}

#[test]
fn a_node_runs_the_slack_recipe_with_each_seats_own_bot_token() {
    runs_per_seat(
        "slack.toml",
        "slack",
        "SLACK_BOT_TOKEN",
        ["ADA_SLACK_BOT_TOKEN", "GRACE_SLACK_BOT_TOKEN"],
    );
}

#[test]
fn a_node_runs_the_github_recipe_with_each_seats_own_token() {
    runs_per_seat(
        "github.toml",
        "github",
        "GITHUB_PERSONAL_ACCESS_TOKEN",
        ["ADA_GITHUB_TOKEN", "GRACE_GITHUB_TOKEN"],
    );
}

#[test]
fn a_node_runs_the_jira_recipe_with_each_seats_own_account() {
    runs_per_seat(
        "jira.toml",
        "jira",
        "JIRA_API_TOKEN",
        ["ADA_JIRA_API_TOKEN", "GRACE_JIRA_API_TOKEN"],
    );
}
