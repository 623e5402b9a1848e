//! Posting through a reply tool.
//!
//! Rules, and why:
//! - A post that answers a trigger waiting for a reply goes through that
//!   trigger's own record ([`super::owed`]): once per trigger, across
//!   crashes and re-batching.
//! - Any other post is at most once per turn and target: its key (turn,
//!   server, tool, target — [`trigger::reply_key`]) is
//!   created in the ledger bucket **before** the tool runs. Created: post.
//!   There already: this turn (or an earlier run of the same turn, which
//!   has the same id) posted there — not posted again, and it counts as
//!   posted when delivery is judged.
//! - The budget park's notice claims its keys the same way, one per trigger
//!   and window parked on ([`super::notice`]), never the trigger's reply.
//! - Unknown: nothing is posted (never twice) and the turn fails as an
//!   outage, to be run again.
//! - The tool refused (a definite "not posted"): the key is removed so a
//!   corrected attempt can post. The tool unreachable mid-call: it may have
//!   posted, so the key stays.

use crewlet_coord::{Answer, CoordError, Ledger};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::dispatch::Answered;
use super::owed::{CLASS, Posting, text_of};
use super::{Brain, Park, Run, Stop};
use crate::ports::{Said, Toolbox};
use crate::trigger::{self, Target};

/// One reply's key in the ledger bucket.
pub(super) struct ReplyKey {
    id: String,
    target: Target,
}

/// A reply key's record in the ledger bucket: which turn of which seat
/// posted to which target.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ReplyRecord {
    turn_id: String,
    seat: String,
    target: String,
}

/// What creating the key said.
pub(super) enum Claim {
    /// Ours: post.
    Won,
    /// Already there: posted before.
    Posted,
}

impl ReplyKey {
    fn new(turn_id: &str, server: &str, tool: &str, target: Target) -> ReplyKey {
        ReplyKey {
            id: trigger::reply_key(turn_id, server, tool, &target),
            target,
        }
    }

    /// The key of the budget park's notice for `trigger` at `target`, one
    /// per window parked on ([`super::notice`]).
    pub(super) fn park_notice(trigger: &str, park: &Park, target: Target) -> ReplyKey {
        let d = Sha256::digest(
            format!(
                "budget-park\n{trigger}\n{}\n{}\n{}\n{target}",
                park.scope_name(),
                park.period_name(),
                park.window
            )
            .as_bytes(),
        );
        ReplyKey {
            id: d.iter().take(16).map(|b| format!("{b:02x}")).collect(),
            target,
        }
    }

    /// The key's ledger id: an idempotency key for a surface that dedupes.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    pub(super) async fn claim(
        &self,
        ledger: &Ledger,
        turn_id: &str,
        seat: &str,
    ) -> Result<Claim, CoordError> {
        let record = ReplyRecord {
            turn_id: turn_id.to_owned(),
            seat: seat.to_owned(),
            target: self.target.to_string(),
        };
        Ok(
            match ledger
                .claims::<ReplyRecord>(CLASS)
                .claim(&self.id, &record)
                .await?
            {
                Answer::Yes(_) => Claim::Won,
                Answer::No(_) => Claim::Posted,
            },
        )
    }

    /// Frees the key after a definite "not posted". Best effort: a key left
    /// behind refuses a corrected attempt, never allows a second post.
    pub(super) async fn release(&self, ledger: &Ledger) {
        let _ = ledger.remove_record(CLASS, &self.id).await;
    }
}

impl<B: Brain, T: Toolbox> Run<'_, B, T> {
    /// Posts through a reply tool, at most once per turn and target.
    pub(super) async fn post_reply(
        &mut self,
        server: &str,
        tool: &str,
        args: Value,
    ) -> Result<Answered, Stop> {
        let Some(target) = Target::of_arguments(&args) else {
            return Ok(Answered::error(format!(
                "{tool} needs a `channel` (and the `thread`) to post to"
            )));
        };
        if let Some(posting) = self.post_owed(server, tool, args.clone(), &target).await {
            return Ok(self
                .answered_owed(server, tool, &args, target, posting?)
                .await);
        }
        let key = ReplyKey::new(&self.turn_id, server, tool, target);
        match key
            .claim(&self.engine.ledger, &self.turn_id, &self.handle)
            .await
        {
            Ok(Claim::Won) => {}
            Ok(Claim::Posted) => {
                return Ok(Answered {
                    posted_to: Some(key.target.clone()),
                    ..Answered::ok(format!(
                        "Already posted to {} in this turn; not posted again.",
                        key.target
                    ))
                });
            }
            Err(e) => {
                return Err(Stop::Outage(format!(
                    "cannot record the reply key for {}: {e}",
                    key.target
                )));
            }
        }
        let text = text_of(&args);
        match self.tools.call(server, tool, args, &self.turn_id).await {
            Ok(out) if !out.is_error => {
                self.posted(server, tool, &key.target, text, None).await;
                Ok(Answered {
                    posted_to: Some(key.target),
                    ..Answered::ok(out.text)
                })
            }
            Ok(out) => {
                key.release(&self.engine.ledger).await;
                Ok(Answered::error(out.text))
            }
            Err(e) => Ok(Answered::error(format!(
                "the reply tool could not be reached (not retried, it may have posted): {e}"
            ))),
        }
    }

    /// What the model reads back after a post for owed replies.
    async fn answered_owed(
        &mut self,
        server: &str,
        tool: &str,
        args: &Value,
        target: Target,
        posting: Posting,
    ) -> Answered {
        match posting {
            Posting::Posted(out) => {
                self.posted(server, tool, &target, text_of(args), None)
                    .await;
                Answered {
                    posted_to: Some(target),
                    ..Answered::ok(out)
                }
            }
            Posting::AlreadyAnswered => Answered {
                text: format!("Already answered in {target}; not posted again."),
                ok: true,
                posted_to: Some(target),
            },
            Posting::Refused(out) => Answered::error(out),
            Posting::Unreachable { error, retry: true } => Answered::error(format!(
                "the reply tool could not be reached: {error}. It dedupes posts, so posting the same reply again is safe."
            )),
            Posting::Unreachable {
                error,
                retry: false,
            } => Answered::error(format!(
                "the reply tool could not be reached (not retried, it may have posted): {error}"
            )),
            Posting::TooLarge(size) => Answered::error(format!(
                "the reply is {size} bytes; a reply may be at most 64 KiB: shorten it"
            )),
        }
    }

    /// Records a post that landed: what the seat said, the thread it now
    /// follows ([`super::follow`]), and `reply_posted` (`recovered_from`:
    /// the turn that began it, when this run finished it).
    pub(super) async fn posted(
        &mut self,
        server: &str,
        tool: &str,
        target: &Target,
        text: String,
        recovered_from: Option<&str>,
    ) {
        let followed = self.follow(target).await;
        self.said.push(Said {
            turn_id: self.turn_id.clone(),
            text: text.clone(),
            at_ms: self.engine.clock.now_ms(),
        });
        let mut payload = json!({"turn_id": self.turn_id, "server": server, "tool": tool, "target": target.to_string(), "text": text});
        if let Some(from) = recovered_from {
            payload["recovered_from"] = json!(from);
        }
        match followed {
            Ok(Some(thread)) => payload["follows"] = json!(thread.to_string()),
            Ok(None) => {}
            Err(e) => payload["follow_error"] = json!(e),
        }
        self.emit("reply_posted", payload).await;
    }
}
