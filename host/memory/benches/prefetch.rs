//! The turn-start prefetch at size, against one raw model request in the
//! same run: a seat with NOTES notes and EPISODES episodes (DIM-dim
//! vectors) in a real SQLite store, a profile of the asker, learned skills
//! and its onboarding marker; embeddings on, the trigger embedded by a
//! local OpenAI-compatible server (`/v1/embeddings` over real HTTP). Each
//! run times `crewlet_turns::prefetch_recalled` (every block the engine
//! fetches before a turn's first call: the trigger's embedding, personal
//! memory, similar prior work, the known counterparty, skills,
//! onboarding; the roster is rendered from the company in memory and left
//! out), then one raw `/v1/chat/completions` request to the same server.
//!
//! `cargo bench -p crewlet-memory --bench prefetch --profile release`;
//! `NOTES=N` (default 10,000), `EPISODES=N` (1,000), `DIM=N` (256),
//! `RUNS=N` (200).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{env, pct, values, vector};
use crewlet_store::{DiaryNote, Episode, Learned, Onboarded, Origin, Profile, Store};
use crewlet_testkit::openai::{Reply, ScriptedOpenAi};
use crewlet_turns::{
    EmbedError, EmbedSite, Embedded, Embedder, MemoryFault, Note, Recall, Recalled, SeatMemory,
    SkillSource, TurnMemory, Vector,
};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MODEL: &str = "bench/lcg";
const BASE: i64 = 1_765_000_000_000;

/// One HTTP/1.1 POST of `body` to `addr`, the answer's JSON body.
async fn post(addr: &str, path: &str, body: &Value) -> Value {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-bench\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    serde_json::from_str(body).unwrap()
}

/// The company's embedding model: the local server's `/v1/embeddings`.
struct Http {
    addr: String,
}

impl Embedder for Http {
    fn model(&self) -> Option<String> {
        Some(MODEL.into())
    }

    async fn embed(&self, texts: Vec<String>, _site: &EmbedSite) -> Result<Embedded, EmbedError> {
        let answer = post(
            &self.addr,
            "/v1/embeddings",
            &json!({ "model": "embed", "input": texts }),
        )
        .await;
        let mut data: Vec<(u64, Vec<f32>)> = answer["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let v = d["embedding"].as_array().unwrap();
                let v = v.iter().map(|x| x.as_f64().unwrap() as f32).collect();
                (d["index"].as_u64().unwrap(), v)
            })
            .collect();
        data.sort_by_key(|(i, _)| *i);
        Ok(Embedded {
            model: MODEL.into(),
            vectors: data.into_iter().map(|(_, v)| v).collect(),
            tokens: answer["usage"]["total_tokens"].as_u64().unwrap_or(0),
        })
    }
}

/// The seat's memory over the store, read as the node reads it for a
/// prefetch (on the blocking pool; a carried skill's use written).
struct Stored(Arc<Store>);

fn fault(e: impl std::fmt::Display) -> MemoryFault {
    MemoryFault(e.to_string())
}

fn lift(rows: Vec<crewlet_store::Recalled<String>>) -> Vec<Recalled> {
    rows.into_iter()
        .map(|r| Recalled {
            text: r.row,
            at_ms: 0,
            distance: r.distance,
        })
        .collect()
}

impl Stored {
    fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<R, crewlet_store::StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<R, MemoryFault>> {
        let store = self.0.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || f(&store))
                .await
                .map_err(fault)?
                .map_err(fault)
        })
    }
}

impl SeatMemory for Stored {
    fn remember(&self, _seat: &str, _note: Note) -> BoxFuture<'_, Result<(), MemoryFault>> {
        Box::pin(async { Err(MemoryFault("a prefetch does not remember".into())) })
    }

    fn notes(
        &self,
        seat: &str,
        query: Option<Vector>,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>> {
        let seat = seat.to_owned();
        let read = self.blocking(move |s| {
            let rows = s.recall_notes(&seat, query.as_ref(), max_distance, limit)?;
            Ok(rows
                .into_iter()
                .map(|r| crewlet_store::Recalled {
                    row: r.row.text,
                    distance: r.distance,
                })
                .collect())
        });
        Box::pin(async move { read.await.map(lift) })
    }

    fn episodes(
        &self,
        seat: &str,
        query: Vector,
        max_distance: f64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Recalled>, MemoryFault>> {
        let seat = seat.to_owned();
        let read = self.blocking(move |s| {
            let rows = s.recall_episodes(&seat, &query, max_distance, limit)?;
            Ok(rows
                .into_iter()
                .map(|r| crewlet_store::Recalled {
                    row: r.row.summary,
                    distance: r.distance,
                })
                .collect())
        });
        Box::pin(async move { read.await.map(lift) })
    }

    fn profile(
        &self,
        seat: &str,
        counterparty: &str,
    ) -> BoxFuture<'_, Result<Option<String>, MemoryFault>> {
        let (seat, who) = (seat.to_owned(), counterparty.to_owned());
        self.blocking(move |s| Ok(s.profile(&seat, &who)?.map(|p| p.known)))
    }

    fn onboarded(&self, seat: &str) -> BoxFuture<'_, Result<bool, MemoryFault>> {
        let seat = seat.to_owned();
        self.blocking(move |s| Ok(s.onboarded(&seat)?.is_some()))
    }

    fn ended(&self, _seat: &str, _turn: TurnMemory) -> BoxFuture<'_, Result<(), MemoryFault>> {
        Box::pin(async { Err(MemoryFault("a prefetch does not end turns".into())) })
    }
}

impl SkillSource for Stored {
    fn skills(
        &self,
        seat: &str,
        _trigger: &str,
    ) -> BoxFuture<'_, Result<Vec<String>, MemoryFault>> {
        let seat = seat.to_owned();
        // Carrying a skill is its use, counted on the row, as the node does.
        self.blocking(move |s| {
            let carried = s.active_skills(&seat, 5)?;
            let ids: Vec<String> = carried.iter().map(|(k, _)| k.skill_id.clone()).collect();
            s.use_skills(&seat, &ids, BASE)?;
            Ok(carried
                .into_iter()
                .map(|(k, procedure)| format!("{} (v{}): {procedure}", k.name, k.version))
                .collect())
        })
    }
}

/// The seat `ada` at size, and a second seat as large beside it.
fn seed(store: &Store, notes: usize, episodes: usize, dim: usize) {
    for seat in ["ada", "bob"] {
        let rows: Vec<DiaryNote> = (0..notes)
            .map(|i| DiaryNote {
                seat: seat.into(),
                note_id: format!("019a-{i:07}.1"),
                text: format!(
                    "Note {i}: the deploy of service {} went out at 14:02.",
                    i % 97
                ),
                turn_id: Some(format!("019a-{i:07}")),
                created_ms: BASE + i as i64,
                updated_ms: BASE + i as i64,
                vector: Some(vector(i, dim)),
                change_seq: 0,
            })
            .collect();
        for chunk in rows.chunks(1_000) {
            store.apply_notes(chunk).unwrap();
        }
        let rows: Vec<Episode> = (0..episodes)
            .map(|i| Episode {
                seat: seat.into(),
                turn_id: format!("019b-{i:07}"),
                conversation: Some(format!("C1#{i}.1")),
                trigger: format!("is build {i} green?"),
                asked_by: vec!["slack:U1".into()],
                tools: vec!["chat.post".into()],
                reply: Some(format!("Build {i} is green.")),
                outcome: "delivered".into(),
                input_tokens: 900,
                output_tokens: 40,
                summary: format!("Asked whether build {i} was green; answered in the thread."),
                ended_ms: BASE + i as i64,
                updated_ms: BASE + i as i64,
                vector: Some(vector(notes + i, dim)),
                change_seq: 0,
            })
            .collect();
        store.apply_episodes(&rows).unwrap();
    }
    store
        .apply_profiles(&[Profile {
            seat: "ada".into(),
            counterparty: "slack:U1".into(),
            known: "asks about builds; prefers short answers".into(),
            turns: 50,
            first_ms: BASE,
            last_ms: BASE,
            updated_ms: BASE,
            change_seq: 0,
        }])
        .unwrap();
    store
        .apply_markers(&[Onboarded {
            seat: "ada".into(),
            turn_id: "019a-0000000".into(),
            onboarded_ms: BASE,
            updated_ms: BASE,
            change_seq: 0,
        }])
        .unwrap();
    for (i, name) in ["Build status check", "Deploy check", "Triage"]
        .iter()
        .enumerate()
    {
        store
            .learn_skill(
                &Learned {
                    seat: "ada",
                    name,
                    origin: Origin::Induced,
                    promoted_from: &[],
                    procedure: "1. Find the build by number. 2. Reply in the thread with its status.",
                    episodes: &[],
                    model: "openai/reflect",
                },
                BASE + i as i64,
            )
            .unwrap();
    }
}

fn main() {
    let (notes, episodes) = (env("NOTES", 10_000), env("EPISODES", 1_000));
    let (dim, runs) = (env("DIM", 256), env("RUNS", 200));
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_in(dir.path()).unwrap());
    let t = Instant::now();
    seed(&store, notes, episodes, dim);
    eprintln!(
        "seeded {notes} notes and {episodes} episodes for each of ada and bob in {:?}",
        t.elapsed()
    );
    let ai = ScriptedOpenAi::start();
    let addr = ai.origin().trim_start_matches("http://").to_owned();
    let stored = Arc::new(Stored(store));
    let recall = Recall {
        memory: stored.clone(),
        embedder: Arc::new(Http { addr: addr.clone() }),
        skills: stored,
    };
    let asker = ("slack:U1".to_owned(), "Grace".to_owned());
    let (mut prefetch, mut raw) = (Vec::new(), Vec::new());
    common::runtime().block_on(async {
        for r in 0..runs + 5 {
            // The trigger lands on one note: the block renders a hit.
            ai.reply("embed", Reply::Vectors(vec![values(r * 7 % notes, dim)]));
            ai.reply("raw", Reply::Text("Build 441 is green.".into()));
            let t = Instant::now();
            let got = crewlet_turns::prefetch_recalled(
                &recall,
                "ada",
                &format!("turn-{r}"),
                "is build 441 green?",
                Some(&asker),
                Instant::now() + Duration::from_secs(3),
            )
            .await;
            let took = t.elapsed();
            for (block, state) in &got.blocks {
                assert!(
                    state["state"] == "rendered" || state["state"] == "empty",
                    "{block}: {state}"
                );
            }
            assert_eq!(got.recall["by"], "meaning", "{}", got.recall);
            let t = Instant::now();
            let answer = post(
                &addr,
                "/v1/chat/completions",
                &json!({ "model": "raw", "messages": [{ "role": "user", "content": "is build 441 green?" }] }),
            )
            .await;
            let model = t.elapsed();
            assert!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
            // The first runs warm the page cache and the connection pool.
            if r >= 5 {
                prefetch.push(took);
                raw.push(model);
            }
        }
    });
    let (p50, p99) = (pct(&mut prefetch, 0.5), pct(&mut prefetch, 0.99));
    let (r50, r99) = (pct(&mut raw, 0.5), pct(&mut raw, 0.99));
    println!(
        "turn-start prefetch of a seat with {notes} notes and {episodes} episodes ({dim}-dim), embeddings on, {runs} runs:"
    );
    println!("  prefetch (every recalled block)           p50 {p50:>9.2?}  p99 {p99:>9.2?}");
    println!("  one raw model request, same local server  p50 {r50:>9.2?}  p99 {r99:>9.2?}");
    println!(
        "  prefetch / raw request                    p50 {:.2}x  p99 {:.2}x",
        p50.as_secs_f64() / r50.as_secs_f64(),
        p99.as_secs_f64() / r99.as_secs_f64()
    );
}
