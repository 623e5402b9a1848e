//! `crewlet doctor`: what `crewlet run` with the same arguments needs,
//! checked without starting anything, each finding with its fix.
//!
//! Rule: the doctor reads what `run` reads (the configuration, the plugins
//! dirs, the company file, the key files) through the same functions, so
//! it can never pass what `run` refuses; it only adds the checks `run`
//! makes later, at start (the nats-server binary, a reachable external
//! NATS, free ports, the secrets the company names). Exit 1 when anything
//! `run` would stop on fails; a warning (a secret not in this shell, which
//! the fleet's bucket may hold) leaves it 0.
//!
//! Next to a running node the doctor asks the API port's `/health` before
//! it calls a port taken: a node with this data dir holding its own ports
//! is the setup working, not a failure; another node there is named. With
//! no plugins dir given it reads `./plugins`, as `crewlet plugins list`
//! does, and says that `run` needs `--plugins` for it. That node's
//! secrets are a finding too: known (ok), or unknown / answered from the
//! last listing (a warning naming why and for how long). Each seat's MCP
//! servers are checked as the node would start them (`mcp.rs`).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crewlet_config::{NodeConfig, Overrides, StreamMode};
use serde::Serialize;

mod mcp;
mod routes;
mod running;

use running::{RunningNode, taken};

/// How long a TCP connect to an external NATS URL (or a running node's
/// `/health`) may take.
const REACH_WITHIN: Duration = Duration::from_secs(2);

/// The plugins dir read when none is given: `crewlet plugins list`'s default.
const DEFAULT_PLUGINS: &str = "plugins";

/// The signing secrets `./dev` exports with a demo value when the shell has
/// none (kept equal to `./dev` by a test).
const DEV_DEMO_SECRETS: [(&str, &str); 2] = [
    ("SLACK_SIGNING_SECRET", "crewlet-demo-slack-secret"),
    ("GITHUB_WEBHOOK_SECRET", "crewlet-demo-github-secret"),
];

/// What the doctor is asked about: `crewlet run`'s own arguments.
#[derive(Debug, Default)]
pub struct DoctorArgs {
    pub config: Option<PathBuf>,
    pub company: Option<PathBuf>,
    pub plugins: Vec<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

/// One finding: what was checked, what was found, and what to do.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub verdict: Verdict,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        verdict: Verdict::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn bad(
    check: &'static str,
    verdict: Verdict,
    detail: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check,
        verdict,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

/// Runs every check and prints the findings; answers the exit status.
pub fn doctor(args: DoctorArgs) -> i32 {
    let findings = examine(&args);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&findings).expect("findings serialise")
        );
    } else {
        for f in &findings {
            let mark = match f.verdict {
                Verdict::Ok => "ok  ",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            println!("{mark} {:<12} {}", f.check, f.detail);
            if let Some(fix) = &f.fix {
                println!("     {:<12} fix: {fix}", "");
            }
        }
    }
    let failed = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Fail)
        .count();
    if failed > 0 {
        if !args.json {
            println!(
                "doctor: {failed} check(s) failed; `crewlet run` with these arguments would not start"
            );
        }
        1
    } else {
        0
    }
}

/// Every finding about `args`, in the order `run` meets them.
pub fn examine(args: &DoctorArgs) -> Vec<Finding> {
    let mut out = Vec::new();
    let overrides = Overrides {
        data_dir: args.data_dir.clone(),
        log_format: None,
    };
    let env = |name: &str| std::env::var(name).ok();
    let config = match NodeConfig::load(args.config.as_deref(), &overrides, &env) {
        Ok(c) => {
            out.push(ok(
                "config",
                match &args.config {
                    Some(f) => format!("{} loads", f.display()),
                    None => "no file: every key takes its default".to_string(),
                },
            ));
            c
        }
        Err(e) => {
            out.push(bad(
                "config",
                Verdict::Fail,
                e.to_string(),
                "correct the key the message names (every other check needs the configuration)",
            ));
            return out;
        }
    };
    let running = RunningNode::find(&config);
    out.push(data_dir(&config));
    out.extend(broker(&config));
    out.extend(ports(&config, running.as_ref()));
    out.extend(
        running
            .as_ref()
            .and_then(|r| r.secrets(crewlet_os::now_ms())),
    );
    out.push(keyring(&config));
    let catalogue = plugins(&config, &args.plugins, &mut out);
    if let Some(file) = &args.company {
        company(&config, file, catalogue.as_ref(), &mut out);
    }
    out
}

fn data_dir(config: &NodeConfig) -> Finding {
    let dir = &config.data_dir;
    let probe = if dir.exists() {
        dir.clone()
    } else {
        match dir.ancestors().skip(1).find(|a| a.exists()) {
            Some(a) => a.to_path_buf(),
            None => {
                return bad(
                    "data dir",
                    Verdict::Fail,
                    format!("{}: no existing parent", dir.display()),
                    "create it, or pass --data-dir",
                );
            }
        }
    };
    let writable = tempfile::tempfile_in(&probe).is_ok();
    match (dir.exists(), writable) {
        (true, true) => ok("data dir", format!("{} is writable", dir.display())),
        (false, true) => ok(
            "data dir",
            format!("{} will be made at first start", dir.display()),
        ),
        (_, false) => bad(
            "data dir",
            Verdict::Fail,
            format!("{} is not writable by this user", probe.display()),
            "run as its owner, or pass --data-dir to a folder this user can write",
        ),
    }
}

fn broker(config: &NodeConfig) -> Vec<Finding> {
    match &config.stream.mode {
        StreamMode::Embedded(spec) => {
            let found = match crewlet_stream::locate::locate_nats_server(
                spec.nats_server.as_deref(),
            ) {
                Ok(path) => path,
                Err(e) => {
                    return vec![bad(
                        "nats-server",
                        Verdict::Fail,
                        e.to_string(),
                        "run scripts/bootstrap.sh (installs it into .tools/), set CREWLET_NATS_SERVER, or stream.nats_server",
                    )];
                }
            };
            let version = std::process::Command::new(&found)
                .arg("--version")
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
            vec![match version {
                Some(v) => ok("nats-server", format!("{} ({v})", found.display())),
                None => bad(
                    "nats-server",
                    Verdict::Fail,
                    format!("{} does not answer --version", found.display()),
                    "reinstall it (scripts/bootstrap.sh) or point stream.nats_server at a working one",
                ),
            }]
        }
        StreamMode::External { urls, .. } => urls.iter().map(|u| reach(u)).collect(),
    }
}

/// A TCP connect to an external NATS URL's host and port.
fn reach(url: &str) -> Finding {
    let hostport = url
        .split("://")
        .last()
        .unwrap_or(url)
        .rsplit('@')
        .next()
        .unwrap_or(url);
    let hostport = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:4222")
    };
    let addrs: Vec<SocketAddr> = match hostport.to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => {
            return bad(
                "nats",
                Verdict::Fail,
                format!("{url}: the name does not resolve: {e}"),
                "correct stream.url",
            );
        }
    };
    if addrs
        .iter()
        .any(|a| TcpStream::connect_timeout(a, REACH_WITHIN).is_ok())
    {
        ok("nats", format!("{url} accepts connections"))
    } else {
        bad(
            "nats",
            Verdict::Fail,
            format!("{url}: nothing accepts connections there within {REACH_WITHIN:?}"),
            "start that NATS server (or cluster), or correct stream.url",
        )
    }
}

fn ports(config: &NodeConfig, running: Option<&RunningNode>) -> Vec<Finding> {
    let mut wanted = Vec::new();
    if config.api.port != 0 {
        wanted.push((
            "api port",
            SocketAddr::new(config.api.host, config.api.port),
            "api.port",
        ));
    }
    if let StreamMode::Embedded(spec) = &config.stream.mode
        && spec.port != 0
    {
        wanted.push((
            "broker port",
            SocketAddr::from(([127, 0, 0, 1], spec.port)),
            "stream.port",
        ));
    }
    if let StreamMode::Embedded(spec) = &config.stream.mode
        && let Some(cluster) = &spec.cluster
    {
        wanted.push(("route port", cluster.listen, "stream.cluster.listen"));
    }
    wanted
        .into_iter()
        .map(|(check, addr, key)| match TcpListener::bind(addr) {
            Ok(_) => ok(check, format!("{addr} is free")),
            Err(e) => taken(check, addr, key, &e, running),
        })
        .collect()
}

fn keyring(config: &NodeConfig) -> Finding {
    let path = &config.secrets.keyring;
    match crewlet_secrets::Keyring::open(path) {
        Ok(k) => ok(
            "keyring",
            format!("{} opens ({} key(s))", path.display(), k.ids().len()),
        ),
        Err(crewlet_secrets::KeyringError::Missing { .. }) => ok(
            "keyring",
            format!("{} will be made at first start", path.display()),
        ),
        Err(e) => bad(
            "keyring",
            Verdict::Fail,
            e.to_string(),
            "restore the keyring from its backup, or make it 0600 and owned by this user",
        ),
    }
}

fn plugins(
    config: &NodeConfig,
    cli: &[PathBuf],
    out: &mut Vec<Finding>,
) -> Option<crewlet_plugins::Catalogue> {
    let mut dirs: Vec<PathBuf> = config.plugin_dirs.iter().chain(cli).cloned().collect();
    let defaulted = dirs.is_empty() && Path::new(DEFAULT_PLUGINS).is_dir();
    if defaulted {
        dirs.push(PathBuf::from(DEFAULT_PLUGINS));
    }
    if dirs.is_empty() {
        out.push(bad(
            "plugins",
            Verdict::Warn,
            "no plugins dir: no webhook, provider or module can run",
            "pass --plugins DIR (the example's are in plugins/)",
        ));
        return None;
    }
    match crewlet_plugins::check(&dirs) {
        Ok(report) if report.is_ok() && defaulted => out.push(bad(
            "plugins",
            Verdict::Ok,
            format!(
                "{} plugin(s) pass in ./{DEFAULT_PLUGINS} (no --plugins given: read as `crewlet plugins list` does)",
                report.plugins.len()
            ),
            format!(
                "`crewlet run` loads no plugins unless told: pass it --plugins {DEFAULT_PLUGINS} (as `./dev run` does)"
            ),
        )),
        Ok(report) if report.is_ok() => out.push(ok(
            "plugins",
            format!("{} plugin(s) pass", report.plugins.len()),
        )),
        Ok(report) => out.push(bad(
            "plugins",
            Verdict::Warn,
            report.problems().join("; "),
            "`crewlet plugins check` names each problem; a broken plugin is skipped at start, and what it would serve is absent",
        )),
        Err(e) => {
            out.push(bad(
                "plugins",
                Verdict::Fail,
                e.to_string(),
                "pass the folders that hold the plugins' plugin.toml files",
            ));
            return None;
        }
    }
    match crewlet_catalog::catalogue(&dirs, config) {
        Ok((catalogue, _)) => Some(catalogue),
        Err(e) => {
            out.push(bad(
                "plugin grants",
                Verdict::Fail,
                e.to_string(),
                "fix the [plugins.grants] table it names: `crewlet run` refuses to start with it",
            ));
            None
        }
    }
}

fn company(
    config: &NodeConfig,
    file: &std::path::Path,
    catalogue: Option<&crewlet_plugins::Catalogue>,
    out: &mut Vec<Finding>,
) {
    let policy = crate::company::policy(config);
    let set = |name: &str| std::env::var_os(name).is_some();
    let loaded = crate::company::CompanyFile::load(file, &policy, false)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            crate::company::runnable(f.company, catalogue)
                .map_err(|e| format!("{}: {e}", file.display()))
        });
    let company = match loaded {
        Ok(c) => {
            out.push(ok(
                "company",
                format!(
                    "{} is valid{}",
                    file.display(),
                    if catalogue.is_some() {
                        " and its plugins are all here"
                    } else {
                        ""
                    }
                ),
            ));
            c
        }
        Err(e) => {
            out.push(bad(
                "company",
                Verdict::Fail,
                e,
                "correct the keys named; `crewlet run --company` refuses it as it stands",
            ));
            // Refused for its MCP servers alone: each seat's are named.
            if let Some(parsed) = std::fs::read_to_string(file)
                .ok()
                .and_then(|text| crewlet_company::Company::parse(&text).ok())
            {
                out.extend(mcp::servers(&parsed, &policy, &set));
            }
            return;
        }
    };
    for name in crewlet_secrets::admin::secret_names(&company) {
        let mut finding = if std::env::var_os(&name).is_some() {
            ok(
                "secret",
                format!(
                    "{name} is set in this environment; a value in the fleet's bucket overrides it (precedence: {})",
                    crewlet_secrets::admin::PRECEDENCE
                ),
            )
        } else {
            bad(
                "secret",
                Verdict::Warn,
                format!("{name} is not in this environment"),
                format!(
                    "fine if the fleet's bucket holds it (`crewlet secrets list`); else `crewlet secrets set {name}` or export it"
                ),
            )
        };
        if let Some(note) = dev_demo(&name, std::env::var(&name).ok().as_deref()) {
            finding.detail.push_str(&format!(" ({note})"));
        }
        out.push(finding);
    }
    out.extend(mcp::servers(&company, &policy, &set));
    out.extend(routes::seat_routes(&company));
}

/// What `./dev` does with `name`, when it is one of its demo secrets.
fn dev_demo(name: &str, value: Option<&str>) -> Option<String> {
    let (_, demo) = DEV_DEMO_SECRETS.iter().find(|(n, _)| *n == name)?;
    Some(match value {
        Some(v) if v == *demo => format!(
            "to `./dev`'s demo value {demo:?}: `./dev sample` signs with it; a real sender needs the real secret"
        ),
        Some(_) => "`./dev` keeps a value set here instead of its demo one".to_owned(),
        None => format!(
            "`./dev run` and `./dev sample` set it to the demo value {demo:?} when unset; a node started by hand needs it exported or in the fleet's bucket"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_secrets_are_the_ones_dev_sets() {
        let dev = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../dev"))
            .expect("./dev is in the repository");
        for (name, value) in DEV_DEMO_SECRETS {
            let line = format!("export {name}=\"${{{name}:-{value}}}\"");
            assert!(dev.contains(&line), "./dev no longer has: {line}");
        }
        assert!(dev_demo("OPENAI_API_KEY", None).is_none());
        let unset = dev_demo("SLACK_SIGNING_SECRET", None).unwrap();
        assert!(unset.contains("crewlet-demo-slack-secret"), "{unset}");
        let demo = dev_demo("SLACK_SIGNING_SECRET", Some("crewlet-demo-slack-secret")).unwrap();
        assert!(demo.contains("demo value"), "{demo}");
    }
}
