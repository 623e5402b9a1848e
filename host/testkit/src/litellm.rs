//! `LiteLlm`: LiteLLM's proxy, a third-party OpenAI-compatible server, run
//! as a real child process on loopback with mock models.
//!
//! Rules, and why:
//! - It is the project's own release from PyPI (`litellm[proxy]`, pinned),
//!   which `scripts/bootstrap.sh --browser` installs into
//!   `.tools/litellm-venv`; a missing install is a failure that names the
//!   command that makes it, never a skipped test.
//! - Its models are mocks LiteLLM itself implements (`mock_response` with
//!   `mock_tool_calls`): every call to a model answers the same assistant
//!   message, with token usage, and no upstream is ever called — or, for a
//!   gateway's cost ([`LiteLlm::spawn_forwarding`]), models forwarded to an
//!   OpenAI-compatible server on loopback. The cost map is read from the
//!   package (`LITELLM_LOCAL_MODEL_COST_MAP`), so the proxy makes no call
//!   beyond loopback.
//! - The config is generated per instance (a master key, the models) in a
//!   temp dir; as JSON, which is YAML.
//! - What it served is read from its own access log, the proxy's word and
//!   not ours.
//! - Starting is split from waiting ([`LiteLlm::spawn`], then
//!   [`LiteLlm::wait_ready`]): the proxy takes seconds to import, and a test
//!   starts its node meanwhile. Dropping the handle kills the child; it also
//!   dies with the test process.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::nats::{free_port, repo_root, spawn_tied};

/// The master key every instance is started with: the bearer a client must
/// send.
pub const MASTER_KEY: &str = "sk-litellm-test-master-key";

/// One model the proxy serves: each call answers `text` and `calls`.
#[derive(Debug, Clone)]
pub struct MockModel {
    name: String,
    text: String,
    calls: Vec<(String, Value)>,
}

impl MockModel {
    /// A model named `name` answering `text` (the message's content).
    pub fn new(name: &str, text: &str) -> MockModel {
        MockModel {
            name: name.to_string(),
            text: text.to_string(),
            calls: Vec::new(),
        }
    }

    /// Adds a tool call (`tool`, arguments object) to every answer, after
    /// the ones already added.
    pub fn call(mut self, tool: &str, arguments: Value) -> MockModel {
        self.calls.push((tool.to_string(), arguments));
        self
    }

    fn entry(&self) -> Value {
        let calls: Vec<Value> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, (tool, args))| {
                json!({
                    "id": format!("call_{}_{i}", self.name),
                    "type": "function",
                    "function": {"name": tool, "arguments": args.to_string()},
                })
            })
            .collect();
        json!({
            "model_name": self.name,
            "litellm_params": {
                "model": format!("openai/{}", self.name),
                "api_key": "never-sent",
                "mock_response": self.text,
                "mock_tool_calls": calls,
            },
        })
    }
}

/// One model the proxy forwards, as it would to a vendor: `name` to the
/// OpenAI-compatible server at `api_base` (`http://127.0.0.1:PORT/v1`),
/// under the same model name, with `api_key` as the bearer.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub name: String,
    pub api_base: String,
    pub api_key: String,
}

impl Upstream {
    fn entry(&self) -> Value {
        json!({
            "model_name": self.name,
            "litellm_params": {
                "model": format!("openai/{}", self.name),
                "api_base": self.api_base,
                "api_key": self.api_key,
            },
        })
    }
}

/// One request the proxy logged: method, path and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub method: String,
    pub path: String,
    pub status: u16,
}

/// The running proxy.
pub struct LiteLlm {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The proxy's entry point in the project's tools dir.
pub fn litellm_bin() -> PathBuf {
    repo_root().join(".tools/litellm-venv/bin/litellm")
}

impl LiteLlm {
    /// Starts the proxy serving `models` on a free loopback port; see
    /// [`LiteLlm::wait_ready`].
    pub fn spawn(models: &[MockModel]) -> LiteLlm {
        LiteLlm::spawn_with(models.iter().map(MockModel::entry).collect())
    }

    /// Starts the proxy forwarding `models` upstream; see
    /// [`LiteLlm::wait_ready`].
    pub fn spawn_forwarding(models: &[Upstream]) -> LiteLlm {
        LiteLlm::spawn_with(models.iter().map(Upstream::entry).collect())
    }

    fn spawn_with(model_list: Vec<Value>) -> LiteLlm {
        let bin = litellm_bin();
        assert!(
            bin.is_file(),
            "LiteLLM's proxy is not installed at {}: run `scripts/bootstrap.sh --browser` \
             (`./dev test` does), which installs the pinned `litellm[proxy]` there",
            bin.display()
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("litellm.yaml");
        let doc = json!({
            "model_list": model_list,
            "general_settings": {"master_key": MASTER_KEY},
        });
        std::fs::write(&config, doc.to_string()).expect("write the LiteLLM config");
        let log = dir.path().join("litellm.log");
        let out = std::fs::File::create(&log).expect("create the LiteLLM log");
        let err = out.try_clone().expect("clone the log handle");
        let port = free_port();
        let mut cmd = Command::new(&bin);
        cmd.arg("--config")
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .current_dir(dir.path())
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("PYTHONUNBUFFERED", "1")
            .env_remove("LITELLM_MASTER_KEY")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = spawn_tied(cmd).unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        LiteLlm {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    /// Waits until the proxy answers its liveness probe; panics with its
    /// log if it exits first or is not up `within`.
    pub fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        let addr = self.addr();
        loop {
            if let Ok(r) = crate::http::get(&addr, "/health/liveliness")
                && r.status == 200
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("LiteLLM's proxy exited ({status}):\n{}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "LiteLLM's proxy not up on {addr} after {within:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `host:port` of its listener.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The base URL a client is pointed at.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Everything the proxy has written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The requests its access log records, oldest first.
    pub fn served(&self) -> Vec<Served> {
        self.log_text().lines().filter_map(access_line).collect()
    }

    /// The chat completions it answered 200.
    pub fn completions(&self) -> usize {
        self.served()
            .iter()
            .filter(|s| s.method == "POST" && s.path.ends_with("/chat/completions"))
            .filter(|s| s.status == 200)
            .count()
    }
}

/// Uvicorn's access line: `INFO:     127.0.0.1:PORT - "POST /path HTTP/1.1" 200 OK`.
fn access_line(line: &str) -> Option<Served> {
    let (_, rest) = line.split_once(" - \"")?;
    let (request, after) = rest.split_once('"')?;
    let mut request = request.split_whitespace();
    let method = request.next()?.to_string();
    let path = request.next()?.to_string();
    let status = after.split_whitespace().next()?.parse().ok()?;
    Some(Served {
        method,
        path,
        status,
    })
}

impl Drop for LiteLlm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_access_line_is_read_and_other_lines_are_not() {
        assert_eq!(
            access_line("INFO:     127.0.0.1:53616 - \"POST /chat/completions HTTP/1.1\" 200 OK"),
            Some(Served {
                method: "POST".into(),
                path: "/chat/completions".into(),
                status: 200
            })
        );
        assert_eq!(access_line("LiteLLM: Proxy initialized with Config"), None);
    }

    #[test]
    fn a_models_calls_are_openai_tool_calls_with_string_arguments() {
        let entry = MockModel::new("exec", "done")
            .call("submit_work", json!({"outcome": "delivered"}))
            .entry();
        let call = &entry["litellm_params"]["mock_tool_calls"][0];
        assert_eq!(call["function"]["name"], "submit_work");
        assert_eq!(call["function"]["arguments"], "{\"outcome\":\"delivered\"}");
        assert_eq!(call["type"], "function");
    }

    #[test]
    fn an_upstream_model_is_forwarded_under_its_own_name_with_no_mock() {
        let entry = Upstream {
            name: "gpt-bench".into(),
            api_base: "http://127.0.0.1:9/v1".into(),
            api_key: "sk-up".into(),
        }
        .entry();
        let params = &entry["litellm_params"];
        assert_eq!(entry["model_name"], "gpt-bench");
        assert_eq!(params["model"], "openai/gpt-bench");
        assert_eq!(params["api_base"], "http://127.0.0.1:9/v1");
        assert_eq!(params["api_key"], "sk-up");
        assert!(params.get("mock_response").is_none(), "{entry}");
    }
}
