//! Follows: which seats follow which chat thread, company-wide.
//!
//! Rules, and why:
//! - **One key per thread.** A thread — its backend (the delivery's
//!   source), channel and thread id — is one key in the follows bucket,
//!   `BACKEND.CHANNEL.THREAD` (each token encoded), holding every seat that
//!   follows it. A message arriving in a thread costs the routing path one
//!   read of that key ([`Follows::followers`]), never a listing: a seat
//!   following 10,000 threads costs an inbound message what one follow does.
//!   The design's record per (backend, seat, channel, thread) is an entry of
//!   that key, each with its own last activity.
//! - **Company-wide.** Whichever node claims the next message in a thread
//!   reads the same key, so a follow written on one node wakes its seat on
//!   any other; no node's own database holds one.
//! - **Ninety days of last activity.** The bucket's age ([`FOLLOW_AGE`])
//!   removes a thread nobody posted in for that long, and every post
//!   re-writes the key. An entry whose own stamp is older than the bucket's
//!   age is dropped when the key is read or written, so a seat that went
//!   quiet in a thread others keep alive stops following it too.
//! - **Compare-and-set.** Two seats posting in one thread at once both
//!   land; a write that lost a race reads again.
//! - **Unknown is never "nobody follows".** A read the store could not
//!   answer is [`CoordError::Unavailable`]; the caller decides (the
//!   notification service delays the delivery).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::answer::{Answer, CoordError, Reply};
use crate::bucket::{Bucket, FOLLOW_AGE};
use crate::kv::{Entry, Expect};
use crate::names::{MAX_KEY_LEN, decode_token, encode_token, preview};
use crate::records::ms;
use crate::{Contention, Coord, decode, encode};

/// A chat thread: the backend it is on (a delivery's `source`: `slack`),
/// the channel within it, and the thread within the channel (a Slack
/// `thread_ts`, an issue number).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChatThread {
    pub backend: String,
    pub channel: String,
    pub thread: String,
}

impl ChatThread {
    pub fn new(
        backend: impl Into<String>,
        channel: impl Into<String>,
        thread: impl Into<String>,
    ) -> ChatThread {
        ChatThread {
            backend: backend.into(),
            channel: channel.into(),
            thread: thread.into(),
        }
    }

    /// The thread's one key: each part one token. An empty part, or a key
    /// past [`MAX_KEY_LEN`], is refused: it names no thread anyone could
    /// follow.
    fn key(&self) -> Result<String, CoordError> {
        let parts = [&self.backend, &self.channel, &self.thread];
        let invalid = |why| CoordError::InvalidName {
            name: preview(&format!(
                "{}:{}#{}",
                self.backend, self.channel, self.thread
            )),
            why,
        };
        if parts.iter().any(|p| p.is_empty()) {
            return Err(invalid(
                "a followed thread needs a backend, a channel and a thread",
            ));
        }
        let key = parts
            .iter()
            .map(|p| encode_token(p))
            .collect::<Vec<_>>()
            .join(".");
        if key.len() > MAX_KEY_LEN {
            return Err(invalid("the thread's encoded key is too long to follow"));
        }
        Ok(key)
    }

    /// The thread a key names; `None` for a key [`ChatThread::key`] did
    /// not make.
    fn from_key(key: &str) -> Option<ChatThread> {
        let mut parts = key.split('.').map(decode_token);
        let (backend, channel, thread) = (parts.next()??, parts.next()??, parts.next()??);
        parts
            .next()
            .is_none()
            .then(|| ChatThread::new(backend, channel, thread))
    }
}

impl std::fmt::Display for ChatThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}#{}", self.backend, self.channel, self.thread)
    }
}

/// A thread's key: each seat following it → when it last posted there
/// (ms since the epoch, this node's clock).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Followed {
    seats: BTreeMap<String, u64>,
}

impl Followed {
    /// Drops the entries whose last activity is older than `age` at `now`.
    fn prune(&mut self, now: SystemTime, age: Duration) {
        let floor = ms(now).saturating_sub(age.as_millis() as u64);
        self.seats.retain(|_, at| *at > floor);
    }
}

/// One thread a seat follows, and when it last posted there (ms since the
/// epoch, the posting node's clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Following {
    pub thread: ChatThread,
    pub last_post_ms: u64,
}

/// The follows contract ([`Coord::follows`]).
#[derive(Clone)]
pub struct Follows {
    coord: Coord,
}

impl Coord {
    /// Which seats follow which chat threads.
    pub fn follows(&self) -> Follows {
        Follows {
            coord: self.clone(),
        }
    }
}

/// What a thread's key holds now, at which revision to write over it
/// (`0`: nothing at all, not even a marker).
struct Read {
    followed: Followed,
    revision: u64,
}

impl Follows {
    const B: Bucket = Bucket::Follows;

    fn age(&self) -> Duration {
        self.coord.kv(Self::B).age(Self::B).unwrap_or(FOLLOW_AGE)
    }

    async fn read(&self, key: &str) -> Result<Read, CoordError> {
        let kv = self.coord.kv(Self::B);
        let (followed, revision) = match kv.get(Self::B, key).await? {
            None => (Followed::default(), 0),
            Some(e) if e.removed => (Followed::default(), e.revision),
            Some(e) => (self.decode(&e)?, e.revision),
        };
        let mut read = Read { followed, revision };
        read.followed.prune(kv.now(), self.age());
        Ok(read)
    }

    fn decode(&self, e: &Entry) -> Result<Followed, CoordError> {
        decode(Self::B, e)
    }

    /// The seats following `thread`, by handle: one read of its key. Unknown
    /// (the store did not answer) is [`CoordError::Unavailable`], never an
    /// empty answer.
    pub async fn followers(&self, thread: &ChatThread) -> Result<Vec<String>, CoordError> {
        let key = thread.key()?;
        Ok(self.read(&key).await?.followed.seats.into_keys().collect())
    }

    /// Every thread `seat` follows, the most recent post first: one
    /// listing of the whole bucket, for a person looking at the seat (the
    /// routing path never lists, see the module docs). Unknown is
    /// [`CoordError::Unavailable`], never an empty answer; a key this
    /// module did not write is skipped.
    pub async fn of_seat(&self, seat: &str) -> Result<Vec<Following>, CoordError> {
        let kv = self.coord.kv(Self::B);
        let (now, age) = (kv.now(), self.age());
        let mut out = Vec::new();
        for e in kv.list(Self::B, None).await? {
            let Some(thread) = ChatThread::from_key(&e.key) else {
                continue;
            };
            let mut followed = self.decode(&e)?;
            followed.prune(now, age);
            if let Some(&last_post_ms) = followed.seats.get(seat) {
                out.push(Following {
                    thread,
                    last_post_ms,
                });
            }
        }
        out.sort_by(|a, b| {
            b.last_post_ms
                .cmp(&a.last_post_ms)
                .then(a.thread.cmp(&b.thread))
        });
        Ok(out)
    }

    /// Records that `seat` posted in `thread` now: it follows the thread,
    /// its last activity there renewed (and the key's age with it). Returns
    /// the key's new revision. On unknown nothing is assumed written.
    pub async fn follow(&self, thread: &ChatThread, seat: &str) -> Result<u64, CoordError> {
        if seat.is_empty() {
            return Err(CoordError::Invalid(format!(
                "a follow of {thread} needs the seat's handle"
            )));
        }
        let key = thread.key()?;
        let kv = self.coord.kv(Self::B);
        let mut tries = Contention::new();
        while tries.again().await {
            let mut read = self.read(&key).await?;
            read.followed.seats.insert(seat.to_owned(), ms(kv.now()));
            let put = kv
                .put(
                    Self::B,
                    &key,
                    encode(&read.followed),
                    Expect::Revision(read.revision),
                )
                .await?;
            if let Ok(rev) = put {
                return Ok(rev);
            }
        }
        Err(CoordError::Contended {
            key,
            attempts: tries.made(),
        })
    }

    /// `seat` stops following `thread`. Yes: it followed and no longer
    /// does; No: it did not follow it. The last follower leaving removes
    /// the key.
    pub async fn leave(&self, thread: &ChatThread, seat: &str) -> Reply<(), ()> {
        let key = thread.key()?;
        let kv = self.coord.kv(Self::B);
        let mut tries = Contention::new();
        while tries.again().await {
            let mut read = self.read(&key).await?;
            if read.followed.seats.remove(seat).is_none() {
                return Ok(Answer::No(()));
            }
            let expect = Expect::Revision(read.revision);
            let written = if read.followed.seats.is_empty() {
                kv.remove(Self::B, &key, expect).await?
            } else {
                kv.put(Self::B, &key, encode(&read.followed), expect)
                    .await?
            };
            if written.is_ok() {
                return Ok(Answer::Yes(()));
            }
        }
        Err(CoordError::Contended {
            key,
            attempts: tries.made(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{CoordOptions, ManualClock, MemoryKv, Owner};

    fn coord() -> (ManualClock, Coord) {
        let clock = ManualClock::new();
        let opts = CoordOptions::new(Owner::incarnation("follows"));
        let kv = MemoryKv::new(Arc::new(clock.clone()), &opts.retentions());
        (clock, Coord::memory(kv, opts))
    }

    #[tokio::test]
    async fn a_follow_ages_out_ninety_days_after_the_seats_last_post() {
        let (clock, c) = coord();
        let f = c.follows();
        let t = ChatThread::new("slack", "C1", "17.1");
        f.follow(&t, "ada").await.unwrap();
        clock.advance(Duration::from_secs(60 * 24 * 3600));
        f.follow(&t, "bob").await.unwrap();
        assert_eq!(f.followers(&t).await.unwrap(), ["ada", "bob"]);
        // Bob keeps the thread's key alive; ada's own last post is 91 days
        // old, so she no longer follows it.
        clock.advance(Duration::from_secs(31 * 24 * 3600));
        assert_eq!(f.followers(&t).await.unwrap(), ["bob"]);
        // Nobody posted for 90 days: the bucket aged the key out.
        clock.advance(Duration::from_secs(60 * 24 * 3600));
        assert!(f.followers(&t).await.unwrap().is_empty());
        // A post renews it.
        f.follow(&t, "ada").await.unwrap();
        assert_eq!(f.followers(&t).await.unwrap(), ["ada"]);
    }

    #[tokio::test]
    async fn a_seats_follows_are_listed_newest_first_without_the_aged_or_the_left() {
        let (clock, c) = coord();
        let f = c.follows();
        let (old, left, new) = (
            ChatThread::new("slack", "C.1", "1.5"),
            ChatThread::new("chat", "general", "7"),
            ChatThread::new("chat", "general", "9"),
        );
        f.follow(&old, "ada").await.unwrap();
        f.follow(&left, "ada").await.unwrap();
        clock.advance(Duration::from_secs(60));
        f.follow(&new, "ada").await.unwrap();
        f.follow(&new, "bob").await.unwrap();
        assert_eq!(f.leave(&left, "ada").await.unwrap(), Answer::Yes(()));
        let threads = |list: Vec<Following>| list.into_iter().map(|x| x.thread).collect::<Vec<_>>();
        assert_eq!(
            threads(f.of_seat("ada").await.unwrap()),
            [new.clone(), old.clone()]
        );
        assert_eq!(
            threads(f.of_seat("bob").await.unwrap()),
            std::slice::from_ref(&new)
        );
        assert!(f.of_seat("eve").await.unwrap().is_empty());
        // Bob keeps `new` alive; ada's own post there ages out with `old`.
        clock.advance(Duration::from_secs(89 * 24 * 3600));
        f.follow(&new, "bob").await.unwrap();
        clock.advance(Duration::from_secs(2 * 24 * 3600));
        assert!(f.of_seat("ada").await.unwrap().is_empty());
        assert_eq!(threads(f.of_seat("bob").await.unwrap()), [new]);
    }

    #[test]
    fn a_thread_without_a_part_or_too_long_is_refused() {
        for t in [
            ChatThread::new("", "C1", "1"),
            ChatThread::new("slack", "", "1"),
            ChatThread::new("slack", "C1", ""),
            ChatThread::new("slack", "C1", "x".repeat(600)),
        ] {
            assert!(
                matches!(t.key(), Err(CoordError::InvalidName { .. })),
                "{t}"
            );
        }
        // Parts that hold dots or colons stay three tokens, distinct.
        let a = ChatThread::new("slack", "C.1", "2").key().unwrap();
        let b = ChatThread::new("slack", "C", "1.2").key().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.split('.').count(), 3);
        assert_eq!(
            ChatThread::from_key(&a),
            Some(ChatThread::new("slack", "C.1", "2"))
        );
        assert_eq!(ChatThread::from_key("slack.C1"), None);
    }
}
