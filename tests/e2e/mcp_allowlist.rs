//! The company document cannot make a node run what the node's own file
//! does not allow: refused at `PUT /config`, at `--company`, at `crewlet
//! config import`, and again at spawn for a revision accepted before.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// A one-seat company; `extra` adds MCP servers to role `dev`, `chat_cwd`
/// runs its chat server in a directory.
fn company(org: &str, extra: &str, chat_cwd: Option<&Path>, log: &Path) -> String {
    let cwd = chat_cwd
        .map(|d| format!("cwd = {:?}\n", d.display().to_string()))
        .unwrap_or_default();
    format!(
        r#"
[org]
name = "{org}"
timezone = "UTC"
[roles.dev]
system_prompt = "You write code."
executor = [{{ provider = "scripted", model = "m" }}]
reviewer = {{ provider = "scripted", model = "r" }}
[roles.dev.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {log:?} }}
{cwd}
{extra}
[seats]
ada = {{ role = "dev" }}
"#,
        log = log.display().to_string()
    )
}

const SHELL: &str =
    "[roles.dev.mcp.shell]\ncommand = \"/bin/sh\"\nargs = [\"-c\", \"id > /tmp/crewlet-pwned\"]\n";

fn shell_at(command: &str) -> String {
    format!("[roles.dev.mcp.shell]\ncommand = {command:?}\nargs = [\"-c\", \"id\"]\n")
}

fn write(sb: &Sandbox, name: &str, text: &str) -> PathBuf {
    let p = sb.path(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn start(sb: &Sandbox, extra_config: &str, company: Option<&Path>) -> Node {
    let mut b = sb.node(extra_config);
    if let Some(c) = company {
        b = b.arg("--company").arg(c);
    }
    let mut node = b.spawn();
    node.wait_ready(Duration::from_secs(60));
    node
}

fn put(node: &Node, doc: &str) -> http::Response {
    http::request(&node.api, "PUT", "/config", &[], doc.as_bytes()).expect("PUT /config answers")
}

/// The refusal's errors as (path, message).
fn errors(r: &http::Response) -> Vec<(String, String)> {
    let v = r.json();
    v["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors in {v}"))
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().to_owned(),
                e["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn put_config_refuses_programs_dirs_and_path_tricks_the_node_does_not_allow() {
    let sb = Sandbox::new();
    let log = sb.path("chat.jsonl");
    let node = start(&sb, "", None);

    let good = put(&node, &company("Acme", "", None, &log));
    assert_eq!(good.status, 201, "{}", good.text());
    let epoch = good.json()["epoch"].as_u64().unwrap();

    std::os::unix::fs::symlink("/bin/sh", sb.path("innocent")).unwrap();
    let innocent = sb.path("innocent").display().to_string();
    for (what, extra, want) in [
        ("a shell", SHELL.to_owned(), "allowed_commands"),
        ("a detour", shell_at("/bin/../bin/sh"), "allowed_commands"),
        ("a symlink", shell_at(&innocent), "allowed_commands"),
        ("a relative path", shell_at("./sh"), "relative path"),
        ("a bare name", shell_at("sh"), "allowed_commands"),
    ] {
        let r = put(&node, &company("Acme", &extra, None, &log));
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        let errs = errors(&r);
        assert_eq!(errs.len(), 1, "{what}: {errs:?}");
        assert_eq!(errs[0].0, "roles.dev.mcp.shell.command", "{what}");
        assert!(errs[0].1.contains(want), "{what}: {}", errs[0].1);
    }

    // A working directory outside the (empty by default) allowed dirs.
    let r = put(&node, &company("Acme", "", Some(Path::new("/tmp")), &log));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(errors(&r)[0].0, "roles.dev.mcp.chat.cwd");
    assert!(errors(&r)[0].1.contains("allowed_dirs"), "{:?}", errors(&r));

    // The node's own binary only as `crewlet mcp …`.
    let own = "[roles.dev.mcp.own]\ncommand = \"crewlet\"\nargs = [\"run\"]\n";
    let r = put(&node, &company("Acme", own, None, &log));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(errors(&r)[0].0, "roles.dev.mcp.own.args");

    // A loader variable on an allowed program.
    let preload = "[roles.dev.mcp.pre]\ncommand = \"crewlet\"\nargs = [\"mcp\", \"chat\"]\nenv = { LD_PRELOAD = \"/tmp/x.so\" }\n";
    let r = put(&node, &company("Acme", preload, None, &log));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(errors(&r)[0].0, "roles.dev.mcp.pre.env.LD_PRELOAD");

    // Nothing refused moved the pointer.
    let got = node.get("/config").unwrap().json();
    assert_eq!(got["epoch"].as_u64(), Some(epoch), "{got}");
    assert!(!Path::new("/tmp/crewlet-pwned").exists());
}

#[test]
fn a_refused_document_stops_the_start_and_the_import_with_the_same_sentence() {
    let sb = Sandbox::new();
    let log = sb.path("chat.jsonl");
    let bad = write(&sb, "bad.toml", &company("Acme", SHELL, None, &log));
    let key = "roles.dev.mcp.shell.command";

    // --company: exit 2, naming the file and the key, before the data dir.
    let cfg = sb.config(crewlet_testkit::free_port(), "");
    let (status, out) = run_to_exit(
        &[
            "run",
            "--config",
            cfg.to_str().unwrap(),
            "--data-dir",
            sb.data_dir().to_str().unwrap(),
            "--company",
            bad.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(
        out.contains(bad.to_str().unwrap()) && out.contains(key),
        "{out}"
    );
    let sentence = out
        .lines()
        .find(|l| l.contains(key))
        .unwrap()
        .trim()
        .to_owned();
    assert!(
        dir_is_absent_or_empty(&sb.data_dir()),
        "the data dir was touched"
    );

    // Through a running node's PUT /config: exit 2, the same sentence.
    let good = write(&sb, "good.toml", &company("Acme", "", None, &log));
    let mut node = start(&sb, "", Some(&good));
    let api = format!("http://{}", node.api);
    let (status, out) = run_to_exit(
        &["config", "import", bad.to_str().unwrap(), "--api", &api],
        &[],
    );
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains(&sentence), "{sentence:?} not in:\n{out}");

    // Into a stopped node's store: judged by that node's file, exit 2.
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(30)).code(), Some(0));
    let data = sb.data_dir();
    let offline = |config: Option<&Path>| {
        let mut args = vec![
            "config".to_owned(),
            "import".into(),
            bad.display().to_string(),
            "--data-dir".into(),
            data.display().to_string(),
            "--api".into(),
            "http://127.0.0.1:9".into(),
        ];
        if let Some(c) = config {
            args.extend(["--config".into(), c.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_to_exit(&args, &[])
    };
    let (status, out) = offline(None);
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains(&sentence), "{sentence:?} not in:\n{out}");
    // A node file that allows the shell accepts it: Tier A decides.
    let wide = write(
        &sb,
        "wide.toml",
        "[mcp]\nallowed_commands = [\"crewlet\", \"/bin/sh\"]\n",
    );
    let (status, out) = offline(Some(&wide));
    assert!(status.success(), "{out}");
}

#[test]
fn a_revision_accepted_under_a_wider_allow_list_does_not_spawn_once_it_shrank() {
    let sb = Sandbox::new();
    let log = sb.path("chat.jsonl");
    let work = sb.path("work");
    std::fs::create_dir(&work).unwrap();
    let doc = write(&sb, "company.toml", &company("Acme", "", Some(&work), &log));
    let wide = format!("[mcp]\nallowed_dirs = [{:?}]\n", work.display().to_string());
    let chat_row = |node: &Node| {
        node.health()["mcp"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["server"] == "chat").cloned())
    };

    let mut node = start(&sb, &wide, Some(&doc));
    assert!(
        eventually(Duration::from_secs(30), || chat_row(&node)
            .is_some_and(|r| r["started"].as_u64() >= Some(1))),
        "chat never started: {}",
        node.health()
    );
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(30)).code(), Some(0));

    // Same data dir, the default [mcp] (no dirs), and the operator's own
    // --company file: the active revision still names the directory.
    let other = write(&sb, "other.toml", &company("Other", "", None, &log));
    let node = start(&sb, "", Some(&other));
    assert!(
        eventually(Duration::from_secs(30), || chat_row(&node).is_some_and(
            |r| {
                r["failed"].as_u64() >= Some(1)
                    && r["last_failure"]
                        .as_str()
                        .is_some_and(|f| f.contains("refused by this node (cwd)"))
            }
        )),
        "the chat server was not refused at spawn: {}",
        node.health()
    );
    assert_eq!(chat_row(&node).unwrap()["started"], 0);

    // /health says what runs, not what the file says.
    let health = node.health();
    let c = &health["company"];
    assert_eq!(c["org"], "Acme", "{c}");
    assert_eq!(c["file_active"], false, "{c}");
    assert_ne!(c["digest"], c["file_digest"], "{c}");
    assert!(
        node.log_text()
            .contains("the fleet serves another revision than the --company document"),
        "no warning in the log"
    );
    let hint = format!("crewlet config import {}", other.display());
    assert_eq!(c["activate_file"], hint.as_str(), "{c}");

    // `--activate-company`: the file is activated whatever the fleet runs.
    let mut node = node;
    node.signal(libc::SIGTERM);
    assert_eq!(node.wait_exit(Duration::from_secs(30)).code(), Some(0));
    let mut node = sb
        .node("")
        .arg("--company")
        .arg(&other)
        .arg("--activate-company")
        .spawn();
    node.wait_ready(Duration::from_secs(60));
    assert!(
        eventually(Duration::from_secs(30), || {
            let c = node.health()["company"].clone();
            c["org"] == "Other" && c["file_active"] == true && c["activate_file"].is_null()
        }),
        "--activate-company did not activate the file: {}",
        node.health()
    );
}
