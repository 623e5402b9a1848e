//! Company documents the end-to-end tests share, and the placeholders a
//! test's document is written with, so a chat server is spelled once.
//!
//! In a document given to [`fill`]: `CHAT_LOG_PATH` is the test's chat log,
//! `{chat}` the chat server of the role `support`, `{chat:ROLE}` that of
//! `ROLE` (one `crewlet mcp chat` child per seat, posting as the seat).

use std::path::Path;

/// The Slack signing secret every test company's Slack route verifies with.
pub const SLACK_SECRET: &str = "slack-signing-secret";

/// One seat, `ada`, thinking with the scripted provider (no vendor): she
/// posts "Hello from ada!" in the thread that woke her and claims delivery.
pub const SCRIPTED_COMPANY: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "scripted", model = "demo", options = { steps = [
  { call = "chat__post_message", args = { channel = "{{wake.channel}}", thread = "{{wake.thread}}", text = "Hello from {{wake.handle}}!" } },
  { call = "submit_work", args = { outcome = "delivered", summary = "replied" } },
] } }]
reviewer = { provider = "scripted", model = "demo-review", options = { steps = [
  { call = "submit_review", args = { verdict = "done" } },
] } }
{chat}
[seats]
ada = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

/// One seat, `ada`, thinking with the OpenAI provider (model `exec-a`,
/// reviewer `review`) on the key `${MODEL_KEY}`: the scripted model server
/// decides what she does.
pub const OPENAI_ONE_SEAT: &str = r#"
[org]
name = "Acme"
[roles.support]
system_prompt = "You answer questions in chat."
executor = [{ provider = "openai", model = "exec-a", credentials = "${MODEL_KEY}" }]
reviewer = { provider = "openai", model = "review", credentials = "${MODEL_KEY}" }
max_iterations = 2
max_tool_rounds = 6
{chat}
[seats]
ada = { role = "support" }
[integrations.slack]
plugin = "slack"
secret = "SLACK_SIGNING_SECRET"
"#;

/// The chat MCP server every seat of `role` gets, one child per seat.
pub fn chat_server(role: &str, log: &Path) -> String {
    format!(
        r#"
[roles.{role}.mcp.chat]
command = "crewlet"
args = ["mcp", "chat"]
env = {{ CHAT_IDENTITY = "${{CREWLET_SEAT}}", CHAT_LOG = {:?} }}
replies = ["post_message"]
"#,
        log.display().to_string()
    )
}

/// [`SCRIPTED_COMPANY`] with `seats` (its `[seats]` lines) in place of
/// ada's, its chat server writing to `chat_log`.
pub fn scripted_company(seats: &str, chat_log: &Path) -> String {
    fill(
        &SCRIPTED_COMPANY.replace("ada = { role = \"support\" }\n", seats),
        chat_log,
    )
}

/// `doc` with its placeholders (see the module docs) filled for `chat_log`.
pub fn fill(doc: &str, chat_log: &Path) -> String {
    let mut doc = doc
        .replace("CHAT_LOG_PATH", &chat_log.display().to_string())
        .replace("{chat}", &chat_server("support", chat_log));
    while let Some(at) = doc.find("{chat:") {
        let end = at + doc[at..].find('}').expect("`{chat:ROLE}` closes");
        let role = doc[at + "{chat:".len()..end].to_owned();
        doc.replace_range(at..=end, &chat_server(&role, chat_log));
    }
    doc
}
