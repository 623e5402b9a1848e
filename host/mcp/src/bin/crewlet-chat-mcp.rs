//! `crewlet-chat-mcp`: the chat MCP server on stdio (see `crewlet_mcp::chat`).
//! Exits 2 with the reason on stderr when it cannot start.

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    match crewlet_mcp::chat::serve_stdio().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crewlet-chat-mcp: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
