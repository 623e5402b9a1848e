//! The recipes in docs/recipes/ (docs/recipes.md) against the real servers
//! they name: each recipe's company and the node's `[mcp]` section are read
//! from the files as shipped, their install prefix pointed at this
//! repository's installs (tests/mcp-servers from its lock file, the Jira
//! server in .tools/mcp-atlassian-venv; both made by scripts/bootstrap.sh);
//! every seat's own child is started over the real MCP protocol with fake
//! tokens and no vendor to reach, and must list the tools the recipe maps.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use crewlet_company::{Company, Seat};
use crewlet_mcp::{CommandPolicy, McpOptions, Resolver, SeatTools, ServerState, SharedChildren};
use crewlet_turns::trigger::Target;
use serde_json::{Value, json};

/// Where docs/recipes.md installs the servers; the recipes name it.
const PREFIX: &str = "/opt/crewlet-mcp";

/// The surface-tool keys a recipe maps in comments until its crewlet has
/// the turn's read-back mapping (docs/recipes.md).
const MAPPED_KEYS: [&str; 3] = ["read_thread", "raise_working", "clear_working"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A stand-in for the recipes' install prefix: links to this repository's
/// installs, each checked (a missing install fails loudly, never skips).
fn prefix() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let installs = [
        (
            "node_modules",
            repo().join("tests/mcp-servers/node_modules"),
            "`./dev test` (or `scripts/bootstrap.sh`, which runs `npm ci` in tests/mcp-servers)",
        ),
        (
            "atlassian",
            repo().join(".tools/mcp-atlassian-venv"),
            "`./dev test` (or `scripts/bootstrap.sh --browser`, which makes .tools/mcp-atlassian-venv)",
        ),
    ];
    for (name, target, how) in installs {
        assert!(
            target.is_dir(),
            "{} is missing: install the recipes' servers with {how}",
            target.display()
        );
        std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap();
    }
    dir
}

/// A shipped file of docs/recipes/, its install prefix pointed at `prefix`.
fn shipped(name: &str, prefix: &Path) -> String {
    let path = repo().join("docs/recipes").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.contains(PREFIX),
        "{name} no longer installs under {PREFIX}"
    );
    text.replace(PREFIX, &prefix.display().to_string())
}

/// The node's `[mcp]` allow-list from docs/recipes/node.toml.
fn node_policy(prefix: &Path) -> CommandPolicy {
    let file = prefix.join("node.toml");
    std::fs::write(&file, shipped("node.toml", prefix)).unwrap();
    let config = crewlet_config::NodeConfig::load(Some(&file), &Default::default(), &|_| None)
        .unwrap_or_else(|e| panic!("docs/recipes/node.toml: {e}"));
    CommandPolicy::new(&config.mcp, None)
}

/// The tools a recipe maps for the turn's read-back
/// (`read_thread = { tool = "NAME", … }`); `= false` maps none, and a line
/// commented out is not read.
fn mapped_tools(text: &str) -> Vec<(String, String, Value)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if !MAPPED_KEYS.contains(&key) {
            continue;
        }
        let value = value.trim();
        if value.starts_with("false") {
            continue;
        }
        let table: toml::Value = toml::from_str(&format!("v = {value}"))
            .unwrap_or_else(|e| panic!("`{key}` in a recipe is not a TOML value: {e}"));
        let tool = table["v"]["tool"]
            .as_str()
            .unwrap_or_else(|| panic!("`{key}` names no `tool`: {value}"));
        let arguments = table["v"]
            .get("arguments")
            .map(|a| serde_json::to_value(a).unwrap())
            .unwrap_or_else(|| json!({}));
        found.push((key.to_owned(), tool.to_owned(), arguments));
    }
    found
}

/// The seat's credentials as the node resolves them (`credentials` first),
/// each secret answered by a fake value naming it.
fn fake_secrets(seat: &Seat) -> Resolver {
    let own: BTreeMap<String, String> = seat
        .credentials
        .iter()
        .map(|(k, v)| (k.clone(), fake(v.name_str())))
        .collect();
    Resolver::new(move |name: &str| match own.get(name) {
        Some(v) => crewlet_secrets::Lookup::Found(v.clone()),
        None => crewlet_secrets::Lookup::Unset,
    })
}

fn fake(secret: &str) -> String {
    format!("fake-{secret}")
}

/// The child's environment, as the kernel holds it.
fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// `args` give every argument `tool`'s listed schema requires, and none it
/// does not take.
fn fits(recipe: &str, tool: &str, schema: &Value, args: &Value) {
    let given = args.as_object().unwrap();
    for name in schema["required"].as_array().into_iter().flatten() {
        let name = name.as_str().unwrap();
        assert!(
            given.contains_key(name),
            "{recipe}: `{tool}` requires `{name}`"
        );
    }
    for name in given.keys() {
        assert!(
            schema["properties"].get(name).is_some(),
            "{recipe}: `{tool}` takes no `{name}`: {schema}"
        );
    }
}

/// A reply a model would send through a recipe's reply tool, to a wake's
/// channel and thread, as the recipe's system prompt tells it to.
struct Reply {
    tool: &'static str,
    wake: (&'static str, Option<&'static str>),
    args: Value,
}

/// `reply`'s arguments fit the tool's listed schema (every required one
/// given, none it does not take), and the engine reads the wake's target
/// back from them, so it judges the post as the reply owed there.
fn check_reply(recipe: &str, schema: &Value, reply: &Reply) {
    fits(recipe, reply.tool, schema, &reply.args);
    let owed = Target {
        channel: reply.wake.0.to_owned(),
        thread: reply.wake.1.map(str::to_owned),
    };
    let posted = Target::of_arguments(&reply.args)
        .unwrap_or_else(|| panic!("{recipe}: the engine finds no channel in {}", reply.args));
    assert!(
        owed.answered_by(&posted),
        "{recipe}: a post to {posted} does not answer {owed}"
    );
}

/// Starts every seat of `recipe` with its own fake token and checks what
/// the recipe maps against what its server lists.
async fn check_recipe(recipe: &str, server: &str, replies: &[Reply]) {
    let prefix = prefix();
    let text = shipped(recipe, prefix.path());
    let company = Company::parse(&text).unwrap_or_else(|e| panic!("docs/recipes/{recipe}: {e}"));
    let policy = node_policy(prefix.path());
    assert_eq!(
        policy.check_company(&company),
        Vec::new(),
        "{recipe}: node.toml's [mcp] allowed_commands must allow every server"
    );
    let opts = McpOptions {
        start_timeout: Duration::from_secs(60),
        policy: std::sync::Arc::new(policy),
        ..McpOptions::default()
    };
    let mapped = mapped_tools(&text);
    assert!(
        company.seats.len() >= 2,
        "{recipe}: two seats, two credentials"
    );
    for seat in company.seats.values() {
        let role = company.role_of(seat);
        let spec = &role.mcp[server];
        assert!(
            !spec.shared,
            "{recipe}: a child per seat, with its own credential"
        );
        assert!(
            !seat.credentials.is_empty(),
            "{recipe}: {} has its own credential",
            seat.handle
        );
        let shared = SharedChildren::new(opts.clone());
        let tools = SeatTools::start(
            &seat.handle.to_string(),
            &role.mcp,
            &shared,
            fake_secrets(seat),
            &opts,
        )
        .await
        .expect("every credential is known here");
        let servers = tools.servers();
        let row = summary(&servers, server);
        match &row.state {
            ServerState::Started { .. } => {}
            other => panic!(
                "{recipe}: `{server}` did not start for {}: {other:?}",
                seat.handle
            ),
        }
        // The seat's child holds the seat's own credential, no other.
        let env = environ(row.pid.expect("a stdio child"));
        for (var, secret) in &seat.credentials {
            assert_eq!(
                env.get(var),
                Some(&fake(secret.name_str())),
                "{recipe}: {}'s child must see its own {var}",
                seat.handle
            );
        }
        let listed = tools.tools(server).unwrap();
        let schema_of = |tool: &str| {
            listed
                .iter()
                .find(|t| t.name == tool)
                .map(|t| t.input_schema.clone())
                .unwrap_or_else(|| {
                    let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
                    panic!("{recipe}: `{server}` offers no `{tool}`; it offers {names:?}")
                })
        };
        let sampled: Vec<&str> = replies.iter().map(|r| r.tool).collect();
        assert_eq!(spec.replies, sampled, "{recipe}: one sample per reply tool");
        for reply in replies {
            check_reply(recipe, &schema_of(reply.tool), reply);
        }
        for (_, tool, arguments) in &mapped {
            fits(recipe, tool, &schema_of(tool), arguments);
        }
        tools.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slack_recipe_starts_each_seats_server_with_its_own_token() {
    let replies = [
        Reply {
            tool: "slack_reply_to_thread",
            wake: ("C0123ABCD", Some("1717171717.000100")),
            args: json!({"channel_id": "C0123ABCD", "thread_ts": "1717171717.000100", "text": "On it."}),
        },
        Reply {
            tool: "slack_post_message",
            wake: ("D0123ABCD", None),
            args: json!({"channel_id": "D0123ABCD", "text": "On it."}),
        },
    ];
    check_recipe("slack.toml", "slack", &replies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_github_recipe_starts_each_seats_server_with_its_own_token() {
    let replies = [Reply {
        tool: "add_issue_comment",
        wake: ("acme/app", Some("7")),
        args: json!({"owner": "acme", "repo": "app", "issue_number": 7, "body": "On it."}),
    }];
    check_recipe("github.toml", "github", &replies).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jira_recipe_starts_each_seats_server_with_its_own_token() {
    let replies = [Reply {
        tool: "jira_add_comment",
        wake: ("ACME", Some("ACME-12")),
        args: json!({"issue_key": "ACME-12", "body": "On it."}),
    }];
    check_recipe("jira.toml", "jira", &replies).await;
}

#[test]
fn the_mapped_tools_are_read_from_live_lines_only() {
    let text = r#"
        # read_thread = { tool = "get_replies", arguments = { ts = "{thread}" } }
        # raise_working = false
        read_thread = { tool = "live" }
        # sources = ["slack"]
    "#;
    let named =
        |key: &str, tool: &str, arguments: Value| (key.to_owned(), tool.to_owned(), arguments);
    assert_eq!(
        mapped_tools(text),
        [named("read_thread", "live", json!({}))]
    );
}
