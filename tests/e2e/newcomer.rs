//! The example company as a newcomer runs it, through the real binary:
//! `crewlet run --data-dir X` started from another folder, with the
//! repository's plugins folder as `./dev run` passes it. Its chat log and
//! operator token live in X; the command line reaches it with
//! `--data-dir X` and, without it, says exactly that; `crewlet doctor`
//! beside it recognises it; and a clean stop logs no WARN, in a log file
//! free of colour codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{self, Node, Sandbox, crewlet_bin};
use crewlet_testkit::nats::{nats_server_bin, repo_root};

const SLACK_SECRET: &str = "crewlet-demo-slack-secret";

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/company.toml")
}

/// The repository's plugins folder, which `./dev run` passes (every
/// plugin in it: the presence modules' watches among them).
fn plugins() -> PathBuf {
    repo_root().join("plugins")
}

/// `crewlet ARGS` run in `cwd` with `envs` and no token or data dir of the
/// test's own environment; answers (exit code, stdout + stderr).
fn crewlet(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(crewlet_bin())
        .args(args)
        .current_dir(cwd)
        .env_remove("CREWLET_TOKEN")
        .env_remove("CREWLET_DATA_DIR")
        .env_remove("CREWLET_API")
        .env_remove("CREWLET_CONFIG")
        .env_remove("CREWLET_PLUGINS")
        .env_remove("SLACK_SIGNING_SECRET")
        .env_remove("GITHUB_WEBHOOK_SECRET")
        .env("CREWLET_NATS_SERVER", nats_server_bin())
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run crewlet");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// `crewlet doctor --json` beside the node; answers (exit code, findings).
fn doctor(sb: &Sandbox, extra: &[&str], envs: &[(&str, &str)]) -> (i32, Vec<Value>) {
    let config = sb.path("node.toml");
    let company = example();
    let mut args = vec![
        "doctor",
        "--json",
        "--config",
        config.to_str().unwrap(),
        "--company",
        company.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    // In the repository's root, whose `plugins/` is read when none is given.
    let (code, out) = crewlet(&repo_root(), &args, envs);
    let start = out.find('[').unwrap_or_else(|| panic!("no JSON: {out}"));
    let findings =
        serde_json::from_str(out[start..].trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    (code, findings)
}

fn finding<'a>(findings: &'a [Value], check: &str) -> &'a Value {
    findings
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} finding in {findings:#?}"))
}

#[test]
fn the_example_company_run_with_a_data_dir_is_reached_diagnosed_and_stopped_cleanly() {
    let sb = Sandbox::new();
    let plugins = plugins();
    let elsewhere = sb.path("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let data = sb.data_dir();
    let mut node: Node = sb
        .node("")
        .arg("--company")
        .arg(example())
        .arg("--plugins")
        .arg(&plugins)
        .env("SLACK_SIGNING_SECRET", SLACK_SECRET)
        .env("GITHUB_WEBHOOK_SECRET", "crewlet-demo-github-secret")
        .current_dir(&elsewhere)
        .spawn();
    node.wait_ready(Duration::from_secs(60));

    // A reply lands in the company chat (its thread of the Slack channel),
    // and nothing in the working folder.
    common::slack_mention(
        &node,
        SLACK_SECRET,
        "grace",
        "Ev1",
        "C0DEMO",
        "1.1",
        "help?",
    );
    let ended = common::wait_events(&node, "turn_ended", 1);
    assert_eq!(
        ended[0]["payload"]["outcome"],
        "delivered",
        "{}",
        node.log_text()
    );
    let chat = node
        .get("/chat/channels/C0DEMO/messages?thread=1.1")
        .expect("GET the thread")
        .json();
    assert_eq!(chat["messages"][0]["author"], "grace", "{chat}");
    assert!(!elsewhere.join("crewlet-data").exists());

    // The CLI without the node's data dir: refused, told which flag.
    let api = format!("http://{}", node.api);
    let abs = std::fs::canonicalize(&data).unwrap();
    let (code, out) = crewlet(&elsewhere, &["agents", "--api", &api], &[]);
    assert_eq!(code, 1, "{out}");
    for needle in [
        "operator.token does not exist",
        &format!("--data-dir {}", abs.display()),
        &format!("CREWLET_DATA_DIR={}", abs.display()),
        "CREWLET_TOKEN",
    ] {
        assert!(out.contains(needle), "no {needle:?} in: {out}");
    }
    // With it (flag or variable): the node's own first-start token.
    let (code, out) = crewlet(
        &elsewhere,
        &[
            "agents",
            "--api",
            &api,
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("grace"), "{out}");
    let (code, out) = crewlet(
        &elsewhere,
        &["budgets", "show", "--api", &api],
        &[("CREWLET_DATA_DIR", data.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{out}");
    // `config import --data-dir X` with a node holding X: through its API,
    // with X's token.
    let company = example();
    let (code, out) = crewlet(
        &elsewhere,
        &[
            "config",
            "import",
            company.to_str().unwrap(),
            "--api",
            &api,
            "--data-dir",
            data.to_str().unwrap(),
            "--wait",
            "5",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}");

    // The doctor beside it: the API port is this node's; ./plugins is read
    // as `plugins list` reads it; ./dev's demo secret is named as such.
    let (code, f) = doctor(
        &sb,
        &["--data-dir", data.to_str().unwrap()],
        &[("SLACK_SIGNING_SECRET", SLACK_SECRET)],
    );
    assert_eq!(code, 0, "{f:#?}");
    let p = finding(&f, "api port");
    assert_eq!(p["verdict"], "ok", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("already running with this data dir"),
        "{p}"
    );
    let p = finding(&f, "plugins");
    assert!(
        p["detail"].as_str().unwrap().contains("plugins list"),
        "{p}"
    );
    assert!(
        p["fix"].as_str().unwrap().contains("--plugins plugins"),
        "{p}"
    );
    let slack = f
        .iter()
        .find(|x| x["check"] == "secret" && x["detail"].as_str().unwrap().contains("SLACK"))
        .unwrap();
    assert!(
        slack["detail"].as_str().unwrap().contains("demo value"),
        "{slack}"
    );
    let github = f
        .iter()
        .find(|x| x["check"] == "secret" && x["detail"].as_str().unwrap().contains("GITHUB"))
        .unwrap();
    assert!(
        github["detail"].as_str().unwrap().contains("./dev run"),
        "{github}"
    );
    // Another data dir: that node is named, and a second run would not start.
    let other = sb.path("other-data");
    let (code, f) = doctor(&sb, &["--data-dir", other.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "{f:#?}");
    let p = finding(&f, "api port");
    assert_eq!(p["verdict"], "fail", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("another crewlet node"),
        "{p}"
    );

    // A clean stop: exit 0, no WARN, and no colour codes in the file.
    node.signal(libc::SIGTERM);
    let status = node.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", node.log_text());
    let log = node.log_text();
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file:\n{log}"
    );
    let warned: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ")).collect();
    assert!(
        warned.is_empty(),
        "a clean run and stop warned:\n{}",
        warned.join("\n")
    );
}
