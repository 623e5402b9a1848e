//! The seat's memory in a turn, at the engine's ports: a deterministic
//! bag-of-words embedder (texts sharing words are near) and a memory twin
//! ranking by cosine distance as the store does. An episode is recalled as
//! similar prior work for a related trigger and not for an unrelated one;
//! a block that fails or hangs is skipped, named in the `prefetch` event,
//! and the turn runs on; the reviewer's prompt carries none of it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crewlet_turns::{
    EmbedError, EmbedSite, Embedded, Embedder, MemoryFault, Note, Outcome, Recall, Recalled,
    SeatMemory, SkillSource, TurnEnd, TurnMemory, Vector,
};
use futures::future::BoxFuture;
use serde_json::Value;

use crewlet_bus::Wake;

use crate::harness::{Doc, Fixture, Step, mention, post, review, submit};

const DIM: usize = 1024;

/// Hashed bag of lower-cased words, L2-normalised.
struct Bag;

fn bag(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; DIM];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let h = word.to_lowercase().bytes().fold(2166136261u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(16777619)
        });
        v[h as usize % DIM] += 1.0;
    }
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter()
        .map(|x| if n > 0.0 { x / n } else { 0.0 })
        .collect()
}

impl Embedder for Bag {
    fn model(&self) -> Option<String> {
        Some("test/bag".into())
    }

    async fn embed(&self, texts: Vec<String>, _site: &EmbedSite) -> Result<Embedded, EmbedError> {
        Ok(Embedded {
            model: "test/bag".into(),
            vectors: texts.iter().map(|t| bag(t)).collect(),
            tokens: 0,
        })
    }
}

fn distance(a: &Vector, b: &Vector) -> Option<f64> {
    (a.model == b.model && a.values.len() == b.values.len()).then(|| {
        let dot: f32 = a.values.iter().zip(&b.values).map(|(x, y)| x * y).sum();
        1.0 - f64::from(dot)
    })
}

/// The seat's memory, in memory; `profile` can fail and `skills` hang.
#[derive(Default)]
struct Twin {
    notes: Mutex<Vec<Note>>,
    ended: Mutex<Vec<TurnMemory>>,
    profiles: Mutex<BTreeMap<String, String>>,
    fail_profile: bool,
}

impl SeatMemory for Twin {
    fn remember(&self, _seat: &str, note: Note) -> BoxFuture<'_, Result<(), MemoryFault>> {
        self.notes.lock().unwrap().push(note);
        Box::pin(async { Ok(()) })
    }

    fn notes(
        &self,
        _seat: &str,
        _query: Option<Vector>,
        _max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>> {
        let notes = self.notes.lock().unwrap();
        let out = notes
            .iter()
            .rev()
            .take(limit)
            .map(|n| Recalled {
                text: n.text.clone(),
                at_ms: n.at_ms,
                distance: None,
            })
            .collect();
        Box::pin(async { Ok(out) })
    }

    fn episodes(
        &self,
        _seat: &str,
        query: Vector,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>> {
        let ended = self.ended.lock().unwrap();
        let mut out: Vec<Recalled> = ended
            .iter()
            .filter_map(|t| {
                let d = distance(t.episode.vector.as_ref()?, &query)?;
                (d <= max_distance).then(|| Recalled {
                    text: t.episode.summary.clone(),
                    at_ms: t.episode.ended_ms,
                    distance: Some(d),
                })
            })
            .collect();
        out.sort_by(|a, b| a.distance.partial_cmp(&b.distance).unwrap());
        out.truncate(limit);
        Box::pin(async { Ok(out) })
    }

    fn profile(
        &self,
        _seat: &str,
        counterparty: &str,
    ) -> BoxFuture<'_, Result<Option<String>, MemoryFault>> {
        let known = self.profiles.lock().unwrap().get(counterparty).cloned();
        let fail = self.fail_profile;
        Box::pin(async move {
            if fail {
                Err(MemoryFault("the profile store is gone".into()))
            } else {
                Ok(known)
            }
        })
    }

    fn onboarded(&self, _seat: &str) -> BoxFuture<'_, Result<bool, MemoryFault>> {
        let done = self.ended.lock().unwrap().iter().any(|t| t.onboarded);
        Box::pin(async move { Ok(done) })
    }

    fn ended(&self, _seat: &str, turn: TurnMemory) -> BoxFuture<'_, Result<(), MemoryFault>> {
        let mut profiles = self.profiles.lock().unwrap();
        for (who, line) in &turn.met {
            profiles.insert(who.clone(), line.clone());
        }
        self.ended.lock().unwrap().push(turn);
        Box::pin(async { Ok(()) })
    }
}

/// Skills that never answer.
struct Hanging;

impl SkillSource for Hanging {
    fn skills(
        &self,
        _seat: &str,
        _trigger: &str,
    ) -> BoxFuture<'_, Result<Vec<String>, MemoryFault>> {
        Box::pin(futures::future::pending())
    }
}

fn with_memory(doc: Doc, twin: Arc<Twin>, skills: Arc<dyn SkillSource>) -> Fixture {
    let mut f = Fixture::new(doc);
    f.engine = f.engine.with_recall(Recall {
        memory: twin,
        embedder: Arc::new(Bag),
        skills,
    });
    f
}

/// Runs one turn that posts and is accepted; asserts it was delivered.
async fn delivered(f: &Fixture, wake: Wake) {
    f.script([
        Step::calls(vec![
            post("C1", "17.1", "on it"),
            submit("delivered", "answered"),
        ]),
        Step::calls(vec![review("done", "ok")]),
    ]);
    let end = f.run(&[wake]).await;
    assert!(
        matches!(
            &end,
            TurnEnd::Ended {
                outcome: Outcome::Delivered,
                ..
            }
        ),
        "{end:?}"
    );
}

/// Runs one delivered turn on a mention saying `text`; its first executor
/// prompt.
async fn turn(f: &Fixture, delivery: &str, text: &str) -> String {
    let from = f.brain.asked().len();
    let mut wake = mention(delivery);
    wake.text = Some(text.into());
    delivered(f, wake).await;
    f.brain.asked()[from].prompt.messages[0].content.clone()
}

async fn prefetches(f: &Fixture) -> Vec<Value> {
    f.events()
        .await
        .into_iter()
        .filter(|e| e.kind == "prefetch")
        .map(|e| e.payload)
        .collect()
}

#[tokio::test]
async fn an_episode_is_similar_prior_work_for_a_related_trigger_only() {
    let twin = Arc::new(Twin::default());
    let f = with_memory(
        Doc::default(),
        twin.clone(),
        Arc::new(crewlet_turns::NoSkills),
    );
    let first = turn(&f, "d1", "where does the deploy key live?").await;
    assert!(first.contains("This is your first turn at Acme"), "{first}");
    assert!(first.contains("(no similar prior work)"), "{first}");
    let kept = twin.ended.lock().unwrap()[0].clone();
    assert!(kept.onboarded && kept.episode.vector.is_some(), "{kept:?}");
    assert_eq!(kept.episode.tools, ["chat__post_message", "submit_work"]);

    let related = turn(&f, "d2", "the deploy key for staging, where does it live?").await;
    let block = related
        .split("Recalled — similar prior work")
        .nth(1)
        .expect("the block is rendered");
    assert!(
        block.contains("where does the deploy key live?") && block.contains("Outcome: delivered"),
        "{related}"
    );
    assert!(
        !related.contains("This is your first turn"),
        "onboarded once: {related}"
    );

    let unrelated = turn(&f, "d3", "Is lunch at noon today?").await;
    assert!(
        unrelated.contains("similar prior work (your earlier turns):\n(no similar prior work)"),
        "{unrelated}"
    );
    let events = prefetches(&f).await;
    assert_eq!(events[1]["recall"]["by"], "meaning");
    assert_eq!(events[1]["blocks"]["similar_prior_work"]["items"], 1);
    assert_eq!(events[2]["blocks"]["similar_prior_work"]["state"], "empty");
    // The reviewer's prompt stays small: none of the recalled blocks.
    let reviewer = f
        .brain
        .asked()
        .iter()
        .filter(|a| a.phase == crewlet_turns::Phase::Reviewer)
        .map(|a| a.prompt.messages[0].content.clone())
        .collect::<Vec<_>>();
    assert!(
        reviewer.iter().all(|p| !p.contains("Recalled")),
        "{reviewer:?}"
    );
}

#[tokio::test]
async fn a_block_that_fails_or_hangs_is_skipped_named_and_the_turn_runs() {
    let twin = Arc::new(Twin {
        fail_profile: true,
        ..Twin::default()
    });
    let doc = Doc {
        prefetch_timeout: Duration::from_millis(300),
        ..Doc::default()
    };
    let f = with_memory(doc, twin, Arc::new(Hanging));
    let mut wake = mention("d1");
    wake.sender = Some(crewlet_bus::Sender {
        ids: vec!["U1".into()],
        who: "Grace (person grace)".into(),
    });
    let started = std::time::Instant::now();
    delivered(&f, wake).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    let events = prefetches(&f).await;
    let blocks = &events[0]["blocks"];
    assert_eq!(
        blocks["known_counterparty"]["state"], "failed",
        "{events:?}"
    );
    assert!(
        blocks["known_counterparty"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("the profile store is gone")
    );
    assert_eq!(blocks["skills"]["state"], "timed_out", "{events:?}");
    assert_eq!(blocks["personal_memory"]["state"], "empty", "{events:?}");
    let prompt = &f.brain.asked()[0].prompt.messages[0].content;
    assert!(
        !prompt.contains("known counterparty") && !prompt.contains("skills you learned"),
        "skipped blocks are not rendered: {prompt}"
    );
    assert!(
        prompt.contains("(your notes nearest this trigger):\n(no note relates to this trigger)"),
        "{prompt}"
    );
}

/// The thread's read-back and the recalled blocks are fetched side by
/// side: a read and a block that each run to their 400 ms bound hold the
/// turn's first call ~400 ms, not ~800.
#[tokio::test]
async fn the_thread_and_the_recalled_blocks_are_fetched_side_by_side() {
    let doc = Doc {
        prefetch_timeout: Duration::from_millis(400),
        surface_timeout: Duration::from_millis(400),
        ..Doc::default()
    };
    let f = with_memory(doc, Arc::new(Twin::default()), Arc::new(Hanging));
    f.chat
        .hang_reads
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let started = std::time::Instant::now();
    delivered(&f, mention("d1")).await;
    let took = started.elapsed();
    let events = f.events().await;
    let read = events.iter().find(|e| e.kind == "thread_read").unwrap();
    assert_eq!(read.payload["status"], "timed_out", "{:?}", read.payload);
    let prefetch = events.iter().find(|e| e.kind == "prefetch").unwrap();
    assert_eq!(
        prefetch.payload["blocks"]["skills"]["state"], "timed_out",
        "{:?}",
        prefetch.payload
    );
    // One after the other they take 800 ms before the first call.
    assert!(
        took < Duration::from_millis(750),
        "the turn took {took:?}: the read-back and the prefetch ran one after the other"
    );
}

/// An embedding provider that is down.
struct Down;

impl Embedder for Down {
    fn model(&self) -> Option<String> {
        Some("test/down".into())
    }

    async fn embed(&self, _texts: Vec<String>, _site: &EmbedSite) -> Result<Embedded, EmbedError> {
        Err(EmbedError::Unavailable("429: rate limited".into()))
    }
}

#[tokio::test]
async fn an_embedding_provider_down_leaves_recall_to_recency_and_the_event_says_why() {
    let twin = Arc::new(Twin::default());
    let mut f = Fixture::new(Doc::default());
    f.engine = f.engine.with_recall(Recall {
        memory: twin.clone(),
        embedder: Arc::new(Down),
        skills: Arc::new(crewlet_turns::NoSkills),
    });
    let prompt = turn(&f, "d1", "where does the deploy key live?").await;
    assert!(
        prompt
            .contains("personal memory (your newest notes; recall is by recency):\n(no notes yet)")
            && prompt.contains("none: without embeddings there is no similar work to find"),
        "{prompt}"
    );
    let events = prefetches(&f).await;
    assert_eq!(events[0]["recall"]["by"], "recency", "{events:?}");
    assert!(
        events[0]["recall"]["why"]
            .as_str()
            .unwrap_or_default()
            .contains("429: rate limited"),
        "{events:?}"
    );
    let kept = twin.ended.lock().unwrap()[0].clone();
    assert_eq!(kept.episode.vector, None, "kept, unembedded");
}
