//! What woke a turn, and who is waiting for what.
//!
//! Rule: whether a reply is owed is decided before the turn starts — never
//! by a model — from two facts. The source's webhook plugin says whether a
//! person waits for an answer, and where (WIT `delivery.owed`, carried on
//! the wake); and the seat was asked: woken by a mention or by its own
//! route. A person who mentioned a seat in a thread, or commented on an
//! issue naming it, waits for an answer there; a seat woken by the same
//! comment as the issue's assignee or reviewer owes the work, not a
//! message. A schedule owes its result where it delivers it, if anywhere.
//! The host keeps no table of vendors: a third-party source is owed
//! replies exactly as a built-in one.

use crewlet_bus::Wake;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The namespace of turn ids (a fixed, random UUID).
const TURN_NAMESPACE: uuid::Uuid = uuid::uuid!("5b0c7e4a-9d1f-4f63-8a2e-3c6b1d0f7e92");

/// Where a reply goes: a channel (a Slack channel, a repository) and,
/// within it, a thread (a `thread_ts`, an issue number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub channel: String,
    pub thread: Option<String>,
}

impl Target {
    /// Whether a post to `other` answers someone waiting at `self`.
    pub fn answered_by(&self, other: &Target) -> bool {
        self.channel == other.channel && (self.thread.is_none() || self.thread == other.thread)
    }

    /// The target a reply tool's arguments name: `channel` (or
    /// `channel_id`, `owner` + `repo` as `owner/repo`, `repo`, `repository`,
    /// `project`, else the project of an `issue_key` such as `ACME-12`) and
    /// `thread` (or `thread_ts`, `issue`, `number`, `issue_number`,
    /// `issue_key`): the words the reply tools of the real surfaces'
    /// servers use (`docs/recipes.md`), so their posts are judged as the
    /// local chat server's are.
    pub fn of_arguments(args: &serde_json::Value) -> Option<Target> {
        let field = |names: &[&str]| {
            names.iter().find_map(|n| match args.get(*n) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => None,
            })
        };
        let thread = field(&[
            "thread",
            "thread_ts",
            "issue",
            "number",
            "issue_number",
            "issue_key",
        ]);
        let channel = match (field(&["owner"]), field(&["repo"])) {
            (Some(owner), Some(repo)) if !repo.contains('/') => Some(format!("{owner}/{repo}")),
            _ => field(&["channel", "channel_id", "repo", "repository", "project"]),
        }
        .or_else(|| project_of(&field(&["issue_key"])?))?;
        Some(Target { channel, thread })
    }
}

/// The project of an issue key (`ACME-12` → `ACME`): letters and digits
/// before the last `-`, a number after it.
fn project_of(key: &str) -> Option<String> {
    let (project, number) = key.rsplit_once('-')?;
    let shaped = !project.is_empty()
        && project
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !number.is_empty()
        && number.chars().all(|c| c.is_ascii_digit());
    shaped.then(|| project.to_owned())
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.thread {
            Some(t) => write!(f, "{}#{t}", self.channel),
            None => f.write_str(&self.channel),
        }
    }
}

/// The reply a wake is owed, if any: one its plugin marked owed, that
/// reached the seat by a mention or its own route; or a schedule's result.
pub fn owed(wake: &Wake) -> Option<Target> {
    if wake.source == "schedule" && wake.reason == "schedule" {
        return Some(Target {
            channel: wake.channel.clone()?,
            thread: wake.thread.clone(),
        });
    }
    let asked = matches!(wake.reason.as_str(), "mention" | "route");
    let at = wake.owed.as_ref().filter(|_| asked)?;
    Some(Target {
        channel: at.channel.clone(),
        thread: at.thread.clone(),
    })
}

/// The completion-ledger key of a wake: the same on every node and on every
/// redelivery.
pub fn trigger_key(wake: &Wake) -> String {
    format!("{}:{}:{}", wake.source, wake.delivery_id, wake.handle)
}

/// A turn's id: derived from the triggers it serves, so a redelivered batch
/// is the same turn (and its reply keys are the same keys).
pub fn turn_id(keys: &[String]) -> String {
    let mut sorted: Vec<&str> = keys.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    uuid::Uuid::new_v5(&TURN_NAMESPACE, sorted.join("\n").as_bytes()).to_string()
}

/// The idempotency key of one reply: per turn, tool and target.
pub fn reply_key(turn_id: &str, server: &str, tool: &str, target: &Target) -> String {
    let d = Sha256::digest(format!("{turn_id}\n{server}\n{tool}\n{target}").as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The trigger as the executor reads it: one fenced `wake` block per wake,
/// the JSON a deterministic model can read fields from, each after a line
/// naming who is talking when its source named the author.
pub fn render(wakes: &[Wake]) -> String {
    let mut s = String::from(if wakes.len() == 1 {
        "You were woken by this trigger:\n"
    } else {
        "You were woken by these triggers (oldest first):\n"
    });
    for w in wakes {
        if let Some(sender) = &w.sender {
            s.push_str(&format!("From {}:\n", sender.who));
        }
        let block = json!({
            "source": w.source,
            "event_type": w.event_type,
            "delivery_id": w.delivery_id,
            "handle": w.handle,
            "reason": w.reason,
            "channel": w.channel,
            "thread": w.thread,
            "reply_owed_at": w.owed,
            "conversation": w.conversation,
            "text": w.text,
        });
        let mut block = block;
        if let Some(sender) = &w.sender {
            block["from"] = json!(sender.who);
            block["from_ids"] = json!(sender.ids);
        }
        s.push_str("```wake\n");
        s.push_str(&block.to_string());
        s.push_str("\n```\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use crewlet_bus::ReplyTo;

    use super::*;

    fn wake(source: &str, event_type: &str, reason: &str) -> Wake {
        let owed_by_plugin = !matches!(event_type, "issues.assigned" | "triggered");
        Wake {
            trace_id: "t".into(),
            delivery_id: "d1".into(),
            source: source.into(),
            event_type: event_type.into(),
            handle: "ada".into(),
            seat_id: "s".into(),
            reason: reason.into(),
            text: Some("hi".into()),
            conversation: Some("C1#17.1".into()),
            channel: Some("C1".into()),
            thread: Some("17.1".into()),
            owed: owed_by_plugin.then(|| ReplyTo {
                channel: "C1".into(),
                thread: Some("17.1".into()),
            }),
            sender: None,
        }
    }

    #[test]
    fn a_mention_in_a_thread_owes_a_reply_there_an_assignment_does_not() {
        let t = owed(&wake("slack", "app_mention", "mention")).unwrap();
        assert_eq!(t.to_string(), "C1#17.1");
        assert!(owed(&wake("github", "issue_comment.created", "mention")).is_some());
        assert!(owed(&wake("github", "issues.assigned", "assignee")).is_none());
        assert!(
            owed(&wake("github", "issue_comment.created", "assignee")).is_none(),
            "owed by the plugin, but the seat was not asked"
        );
        assert!(owed(&wake("datadog", "triggered", "route")).is_none());
        let fired = wake("schedule", "schedule.fired", "schedule");
        assert_eq!(owed(&fired).unwrap().to_string(), "C1#17.1");
        let nowhere = Wake {
            channel: None,
            thread: None,
            owed: None,
            ..fired
        };
        assert!(
            owed(&nowhere).is_none(),
            "a schedule delivered nowhere owes nothing"
        );
    }

    #[test]
    fn any_source_is_owed_where_its_plugin_says_and_older_wakes_still_parse() {
        let custom = Wake {
            owed: Some(ReplyTo {
                channel: "ops".into(),
                thread: None,
            }),
            ..wake("acme-tracker", "ticket.commented", "route")
        };
        let t = owed(&custom).unwrap();
        assert_eq!(
            t.to_string(),
            "ops",
            "the plugin's place, not the addressed one"
        );
        let unmarked = Wake {
            owed: None,
            ..wake("slack", "app_mention", "mention")
        };
        assert!(owed(&unmarked).is_none(), "the host keeps no vendor table");
        // A wake published before WIT 0.4.0 has no `owed`: it parses, and
        // owes nothing.
        let mut old = serde_json::to_value(wake("slack", "app_mention", "mention")).unwrap();
        old.as_object_mut().unwrap().remove("owed");
        let old: Wake = serde_json::from_value(old).unwrap();
        assert_eq!(old.owed, None);
    }

    #[test]
    fn a_post_answers_the_thread_it_was_owed_in_only() {
        let owed = Target {
            channel: "C1".into(),
            thread: Some("17.1".into()),
        };
        let args = json!({"channel": "C1", "thread": "17.1", "text": "x"});
        assert!(owed.answered_by(&Target::of_arguments(&args).unwrap()));
        let elsewhere = json!({"channel": "C1", "thread": "99", "text": "x"});
        assert!(!owed.answered_by(&Target::of_arguments(&elsewhere).unwrap()));
        let issue = json!({"repo": "acme/app", "issue": 7});
        assert_eq!(
            Target::of_arguments(&issue).unwrap().to_string(),
            "acme/app#7"
        );
        assert!(Target::of_arguments(&json!({"text": "x"})).is_none());
    }

    #[test]
    fn the_real_surfaces_reply_tools_name_their_target_in_their_own_words() {
        // Slack's `slack_reply_to_thread`, GitHub's `add_issue_comment`,
        // Jira's `jira_add_comment`, as their servers' schemas name them.
        let slack = json!({"channel_id": "C1", "thread_ts": "17.1", "text": "x"});
        let github = json!({"owner": "acme", "repo": "app", "issue_number": 7, "body": "x"});
        let jira = json!({"issue_key": "ACME-12", "comment": "x"});
        let named = |args: &serde_json::Value| Target::of_arguments(args).unwrap().to_string();
        assert_eq!(named(&slack), "C1#17.1");
        assert_eq!(named(&github), "acme/app#7");
        assert_eq!(named(&jira), "ACME#ACME-12");
        // A channel the arguments name wins over an issue key's project.
        let both = json!({"project": "OPS", "issue_key": "ACME-12"});
        assert_eq!(named(&both), "OPS#ACME-12");
        for not_a_key in ["ACME", "ACME-", "-12", "AC ME-12", "ACME-1x"] {
            assert!(
                Target::of_arguments(&json!({"issue_key": not_a_key})).is_none(),
                "{not_a_key}"
            );
        }
    }

    #[test]
    fn turn_ids_and_reply_keys_are_stable_across_redeliveries() {
        let a = vec!["slack:1:ada".to_owned(), "slack:2:ada".to_owned()];
        let b = vec!["slack:2:ada".to_owned(), "slack:1:ada".to_owned()];
        assert_eq!(turn_id(&a), turn_id(&b));
        assert_ne!(turn_id(&a), turn_id(&a[..1]));
        let t = Target {
            channel: "C1".into(),
            thread: None,
        };
        let k = reply_key(&turn_id(&a), "chat", "post_message", &t);
        assert_eq!(k, reply_key(&turn_id(&b), "chat", "post_message", &t));
        assert_eq!(k.len(), 32);
    }

    /// The JSON of the first `wake` block of a rendered trigger.
    fn block(rendered: &str) -> serde_json::Value {
        let body = rendered
            .split("```wake\n")
            .nth(1)
            .and_then(|b| b.split("\n```").next())
            .unwrap_or_else(|| panic!("no wake block: {rendered}"));
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn the_rendered_trigger_carries_a_wake_block() {
        let r = render(&[wake("slack", "app_mention", "mention")]);
        let v = block(&r);
        assert_eq!(v["channel"], "C1");
        assert_eq!(v["text"], "hi");
        assert!(v.get("from").is_none() && !r.contains("From "), "{r}");
    }

    #[test]
    fn the_rendered_trigger_names_who_is_talking() {
        let w = Wake {
            sender: Some(crewlet_bus::Sender {
                ids: vec!["U07GRACE1".into()],
                who: "Grace Hopper (person grace)".into(),
            }),
            ..wake("slack", "app_mention", "mention")
        };
        let r = render(&[w]);
        assert!(
            r.contains("From Grace Hopper (person grace):\n```wake"),
            "{r}"
        );
        let v = block(&r);
        assert_eq!(v["from"], "Grace Hopper (person grace)");
        assert_eq!(v["from_ids"], serde_json::json!(["U07GRACE1"]));
    }
}
