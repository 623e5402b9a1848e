//! The node's MCP rows for its presence record: one row per server name.
//!
//! Seats report one row per server each; [`merge_status`] folds them. A
//! per-seat server's counts add up (each seat has its own child); a shared
//! server is one child per node however many seats use it, so its counts
//! are not added but taken at most once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clip_reason;

/// How one MCP server fares on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpStatusRow {
    pub server: String,
    pub shared: bool,
    /// Children (or HTTP sessions) running.
    pub started: u32,
    /// Starts that failed.
    pub failed: u32,
    /// Tools the server lists.
    pub tools: u32,
    /// The latest failure's reason, at most [`crate::REASON_MAX`] bytes.
    pub last_failure: Option<String>,
}

/// Folds rows (from every seat, and from [`crate::SharedChildren::status`])
/// into one per server name, in name order. A later row's failure wins.
pub fn merge_status(rows: impl IntoIterator<Item = McpStatusRow>) -> Vec<McpStatusRow> {
    let mut merged: BTreeMap<String, McpStatusRow> = BTreeMap::new();
    for row in rows {
        match merged.get_mut(&row.server) {
            None => {
                let mut row = row;
                row.last_failure = row.last_failure.as_deref().map(clip_reason);
                merged.insert(row.server.clone(), row);
            }
            Some(into) => {
                into.shared |= row.shared;
                if into.shared {
                    into.started = into.started.max(row.started);
                    into.failed = into.failed.max(row.failed);
                } else {
                    into.started = into.started.saturating_add(row.started);
                    into.failed = into.failed.saturating_add(row.failed);
                }
                into.tools = into.tools.max(row.tools);
                if let Some(reason) = row.last_failure {
                    into.last_failure = Some(clip_reason(&reason));
                }
            }
        }
    }
    merged.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        server: &str,
        shared: bool,
        started: u32,
        failed: u32,
        failure: Option<&str>,
    ) -> McpStatusRow {
        McpStatusRow {
            server: server.into(),
            shared,
            started,
            failed,
            tools: started * 3,
            last_failure: failure.map(str::to_owned),
        }
    }

    #[test]
    fn per_seat_rows_add_up_and_shared_rows_count_once() {
        let merged = merge_status([
            row("chat", false, 1, 0, None),
            row("tracker", true, 1, 0, None),
            row("chat", false, 0, 1, Some("unresolved ${TOKEN}")),
            row("chat", false, 1, 0, None),
            row("tracker", true, 1, 0, None),
        ]);
        assert_eq!(
            merged,
            vec![
                McpStatusRow {
                    server: "chat".into(),
                    shared: false,
                    started: 2,
                    failed: 1,
                    tools: 3,
                    last_failure: Some("unresolved ${TOKEN}".into()),
                },
                McpStatusRow {
                    server: "tracker".into(),
                    shared: true,
                    started: 1,
                    failed: 0,
                    tools: 3,
                    last_failure: None,
                },
            ]
        );
    }

    #[test]
    fn merged_failures_are_clipped_and_rows_serialize() {
        let long = "x".repeat(1000);
        let merged = merge_status([row("a", false, 0, 1, Some(&long))]);
        assert!(merged[0].last_failure.as_ref().unwrap().len() <= crate::REASON_MAX);
        let json = serde_json::to_value(&merged[0]).unwrap();
        assert_eq!(json["server"], "a");
        assert_eq!(json["failed"], 1);
        let back: McpStatusRow = serde_json::from_value(json).unwrap();
        assert_eq!(back, merged[0]);
    }

    #[test]
    fn no_rows_merge_to_none() {
        assert!(merge_status(Vec::new()).is_empty());
    }
}
