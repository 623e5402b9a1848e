//! One started MCP server: a stdio child or an HTTP session, with the tool
//! list it gave at start.
//!
//! A stdio child runs with a cleared environment plus a few harmless
//! variables ([`PASSED_ENV`]) and its spec's `env`: the node's own variables
//! hold the company's credentials, and a per-seat child must see only its
//! seat's. It leads its own process group (so stopping it stops what it
//! spawned, e.g. `npx` → `node`), is killed if its handle is dropped, and
//! gets SIGKILL when the thread that forked it ends (`PR_SET_PDEATHSIG`; the
//! forking thread is a runtime worker, which lives as long as the node).

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_company::McpTransport;
use crewlet_os::DieWithParent;
use process_wrap::tokio::{CommandWrap, ProcessGroup};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{Peer, RoleClient, ServiceError, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::task::JoinHandle;

use crate::substitute::{Redactor, SubstituteError, substitute_into};
use crate::{McpError, McpOptions, Resolver, ToolResult, ToolSpec, clip_reason};

/// Variables a stdio child inherits from the node; everything else it gets
/// comes from its spec's `env`.
pub(crate) const PASSED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
];

/// How much of a child's stderr is kept for a failure reason.
const STDERR_TAIL: usize = 1024;

/// A server's spec with every `${NAME}` substituted: what is actually run.
/// Holds secret values, so it has no `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Launch {
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl Launch {
    /// Substitutes the spec's references; the redactor learns every value.
    pub(crate) fn resolve(
        spec: &McpTransport,
        resolve: &Resolver,
    ) -> Result<(Launch, Redactor), SubstituteError> {
        let mut red = Redactor::default();
        let launch = match spec {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => Launch::Stdio {
                command: command.clone(),
                cwd: cwd.clone(),
                args: args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| substitute_into(a, &format!("args[{i}]"), resolve, &mut red))
                    .collect::<Result<_, _>>()?,
                env: env
                    .iter()
                    .map(|(k, v)| {
                        substitute_into(v, &format!("env.{k}"), resolve, &mut red)
                            .map(|v| (k.clone(), v))
                    })
                    .collect::<Result<_, _>>()?,
            },
            McpTransport::Http { url, headers } => Launch::Http {
                url: url.clone(),
                headers: headers
                    .iter()
                    .map(|(k, v)| {
                        substitute_into(v, &format!("headers.{k}"), resolve, &mut red)
                            .map(|v| (k.clone(), v))
                    })
                    .collect::<Result<_, _>>()?,
            },
        };
        Ok((launch, red))
    }
}

type Client = RunningService<RoleClient, ClientConfig>;

/// A started server.
pub(crate) struct Connection {
    server: String,
    /// `` `command` `` or the URL, for messages.
    endpoint: String,
    http: bool,
    peer: Peer<RoleClient>,
    client: tokio::sync::Mutex<Option<Client>>,
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) description: Option<String>,
    pub(crate) instructions: Option<String>,
    pub(crate) pid: Option<u32>,
    stderr: Option<StderrTail>,
    redactor: Redactor,
    stop_timeout: Duration,
}

impl Connection {
    /// Starts `launch` as server `server`: spawn or connect, handshake, list
    /// tools, all within `opts.start_timeout`. The error is a recorded reason
    /// (scrubbed of secrets, clipped).
    pub(crate) async fn start(
        server: &str,
        launch: &Launch,
        redactor: Redactor,
        opts: &McpOptions,
    ) -> Result<Connection, String> {
        let result = match launch {
            Launch::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                Self::start_stdio(server, command, args, env, cwd.as_deref(), &redactor, opts).await
            }
            Launch::Http { url, headers } => {
                Self::start_http(server, url, headers, &redactor, opts).await
            }
        };
        result.map_err(|reason| clip_reason(&redactor.scrub(&reason)))
    }

    async fn start_stdio(
        server: &str,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&str>,
        redactor: &Redactor,
        opts: &McpOptions,
    ) -> Result<Connection, String> {
        let allowed = opts
            .policy
            .check(command, args, env.keys(), cwd)
            .map_err(|e| format!("refused by this node ({}): {e}", e.key()))?;
        // Started by the path that was checked, named as the spec names it.
        let mut cmd = tokio::process::Command::new(&allowed.program);
        cmd.arg0(command);
        if let Some(dir) = &allowed.cwd {
            cmd.current_dir(dir);
        }
        cmd.args(args).env_clear().kill_on_drop(true);
        for name in PASSED_ENV {
            if let Some(value) = std::env::var_os(name) {
                cmd.env(name, value);
            }
        }
        cmd.envs(env);
        cmd.die_with_parent();
        let mut wrapped = CommandWrap::from(cmd);
        wrapped.wrap(ProcessGroup::leader());
        let (transport, stderr) = TokioChildProcess::builder(wrapped)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not run `{command}`: {e}"))?;
        let pid = transport.id();
        let stderr = stderr.map(|s| StderrTail::follow(s, server, redactor.clone()));
        let handshake = tokio::time::timeout(opts.start_timeout, handshake(transport)).await;
        let (client, tools) = match handshake {
            Ok(Ok(done)) => done,
            Ok(Err(reason)) => {
                // The child most likely exited: its stderr says why, better
                // than the transport's error does.
                let said = match &stderr {
                    Some(tail) => tail.finished(Duration::from_secs(2)).await,
                    None => String::new(),
                };
                if said.trim().is_empty() {
                    return Err(format!("`{command}`: {reason}"));
                }
                tracing::debug!(server, "MCP handshake failed: {}", redactor.scrub(&reason));
                return Err(with_stderr(
                    &format!("`{command}` stopped during the MCP handshake"),
                    &said,
                ));
            }
            Err(_) => {
                return Err(format!(
                    "`{command}` gave no MCP handshake and tool list within {:?}; the child was killed",
                    opts.start_timeout
                ));
            }
        };
        let endpoint = format!("`{command}`");
        Ok(Self::assemble(
            server, endpoint, false, client, tools, pid, stderr, redactor, opts,
        ))
    }

    async fn start_http(
        server: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
        redactor: &Redactor,
        opts: &McpOptions,
    ) -> Result<Connection, String> {
        let mut custom = HashMap::new();
        for (name, value) in headers {
            let header = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("headers.{name} is not a valid HTTP header name"))?;
            // Never echo the value: it usually holds a credential.
            let value = http::HeaderValue::from_str(value).map_err(|_| {
                format!("headers.{name}: the value holds characters HTTP headers cannot carry")
            })?;
            custom.insert(header, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom);
        let transport = StreamableHttpClientTransport::from_config(config);
        let handshake = tokio::time::timeout(opts.start_timeout, handshake(transport)).await;
        let (client, tools) = match handshake {
            Ok(Ok(done)) => done,
            Ok(Err(reason)) => return Err(format!("{url}: {reason}")),
            Err(_) => {
                return Err(format!(
                    "{url} gave no MCP handshake and tool list within {:?}",
                    opts.start_timeout
                ));
            }
        };
        Ok(Self::assemble(
            server,
            url.to_owned(),
            true,
            client,
            tools,
            None,
            None,
            redactor,
            opts,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        server: &str,
        endpoint: String,
        http: bool,
        client: Client,
        tools: Vec<rmcp::model::Tool>,
        pid: Option<u32>,
        stderr: Option<StderrTail>,
        redactor: &Redactor,
        opts: &McpOptions,
    ) -> Connection {
        let info = client.peer_info();
        let description = info
            .as_ref()
            .and_then(|i| i.server_info.as_ref())
            .and_then(|s| s.description.clone());
        let instructions = info.as_ref().and_then(|i| i.instructions.clone());
        let tools = tools
            .into_iter()
            .map(|t| ToolSpec {
                server: server.to_owned(),
                name: t.name.into_owned(),
                description: t.description.map(|d| d.into_owned()),
                input_schema: serde_json::Value::Object((*t.input_schema).clone()),
            })
            .collect();
        Connection {
            server: server.to_owned(),
            endpoint,
            http,
            peer: client.peer().clone(),
            client: tokio::sync::Mutex::new(Some(client)),
            tools,
            description,
            instructions,
            pid,
            stderr,
            redactor: redactor.clone(),
            stop_timeout: opts.stop_timeout,
        }
    }

    /// Calls `tool`, bounded by `timeout`. A closed connection answers at
    /// once; a child that dies mid-call fails the call when its pipe closes.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        timeout: Duration,
    ) -> Result<ToolResult, McpError> {
        if self.peer.is_transport_closed() {
            return Err(self.gone(None));
        }
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match tokio::time::timeout(timeout, self.peer.call_tool(params)).await {
            Err(_) => Err(McpError::CallTimeout {
                server: self.server.clone(),
                tool: tool.to_owned(),
                timeout,
            }),
            Ok(Ok(result)) => Ok(tool_result(result)),
            Ok(Err(ServiceError::TransportClosed)) => Err(self.gone(None)),
            Ok(Err(ServiceError::TransportSend(e))) => {
                Err(self.gone(Some(chain(e.error.as_ref()))))
            }
            Ok(Err(ServiceError::McpError(data))) => Err(McpError::CallRefused {
                server: self.server.clone(),
                tool: tool.to_owned(),
                reason: clip_reason(&self.redactor.scrub(&data.message)),
            }),
            Ok(Err(other)) => Err(McpError::CallRefused {
                server: self.server.clone(),
                tool: tool.to_owned(),
                reason: clip_reason(&self.redactor.scrub(&other.to_string())),
            }),
        }
    }

    fn gone(&self, error: Option<String>) -> McpError {
        let reason = if self.http {
            match error {
                Some(error) => format!("{} did not answer: {error}", self.endpoint),
                None => format!("the session with {} closed", self.endpoint),
            }
        } else {
            let said = self.stderr.as_ref().map(StderrTail::snapshot);
            with_stderr(
                &format!("the child {} exited or was killed", self.endpoint),
                said.as_deref().unwrap_or(""),
            )
        };
        McpError::ServerGone {
            server: self.server.clone(),
            reason: clip_reason(&self.redactor.scrub(&reason)),
        }
    }

    /// Closes the connection and waits for the child to exit (stdin closed,
    /// then SIGTERM, then SIGKILL to its process group). Idempotent.
    pub(crate) async fn stop(&self) {
        let client = self.client.lock().await.take();
        if let Some(mut client) = client {
            match client.close_with_timeout(self.stop_timeout).await {
                Ok(Some(_)) => {}
                Ok(None) => tracing::warn!(
                    server = %self.server,
                    "MCP child did not stop within {:?}; it is killed in the background",
                    self.stop_timeout
                ),
                Err(e) => tracing::warn!(server = %self.server, "MCP client task failed: {e}"),
            }
        }
    }
}

async fn handshake<T, E, A>(transport: T) -> Result<(Client, Vec<rmcp::model::Tool>), String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let config = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("crewlet", env!("CARGO_PKG_VERSION")),
    );
    let client = config
        .serve(transport)
        .await
        .map_err(|e| format!("MCP handshake failed: {}", describe_init(&e)))?;
    let tools = client
        .list_all_tools()
        .await
        .map_err(|e| format!("tools/list failed: {}", describe_service(&e)))?;
    Ok((client, tools))
}

/// An initialize failure without the transport's type names.
fn describe_init(e: &rmcp::service::ClientInitializeError) -> String {
    match e {
        rmcp::service::ClientInitializeError::TransportError { error, context } => {
            format!("{context}: {}", chain(error.error.as_ref()))
        }
        other => other.to_string(),
    }
}

fn describe_service(e: &ServiceError) -> String {
    match e {
        ServiceError::TransportSend(error) => chain(error.error.as_ref()),
        other => other.to_string(),
    }
}

/// An error and its sources, each said once.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

fn tool_result(result: CallToolResult) -> ToolResult {
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    ToolResult {
        text,
        is_error: result.is_error.unwrap_or(false),
        structured: result.structured_content,
    }
}

fn with_stderr(reason: &str, stderr: &str) -> String {
    let said = stderr.trim();
    if said.is_empty() {
        reason.to_owned()
    } else {
        // The end of stderr is where a dying child says why.
        let tail_start = said.len().saturating_sub(160);
        let mut start = tail_start;
        while !said.is_char_boundary(start) {
            start += 1;
        }
        format!("{reason}; its stderr: {}", &said[start..])
    }
}

/// The last [`STDERR_TAIL`] bytes a child wrote to stderr, each line also
/// logged at `debug` (scrubbed of the launch's secrets).
struct StderrTail {
    text: Arc<Mutex<String>>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl StderrTail {
    fn follow(stderr: ChildStderr, server: &str, redactor: Redactor) -> StderrTail {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = text.clone();
        let server = server.to_owned();
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let line = redactor.scrub(&line);
                tracing::debug!(server = %server, "mcp child stderr: {line}");
                let mut tail = sink.lock().unwrap_or_else(|p| p.into_inner());
                tail.push_str(&line);
                tail.push('\n');
                if tail.len() > STDERR_TAIL {
                    let mut cut = tail.len() - STDERR_TAIL;
                    while !tail.is_char_boundary(cut) {
                        cut += 1;
                    }
                    tail.drain(..cut);
                }
            }
        });
        StderrTail {
            text,
            reader: Mutex::new(Some(reader)),
        }
    }

    fn snapshot(&self) -> String {
        self.text.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits (at most `bound`) for stderr to reach its end, then answers it.
    async fn finished(&self, bound: Duration) -> String {
        let reader = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(reader) = reader {
            let _ = tokio::time::timeout(bound, reader).await;
        }
        self.snapshot()
    }
}

impl Drop for StderrTail {
    fn drop(&mut self) {
        if let Some(reader) = self
            .reader
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            reader.abort();
        }
    }
}
