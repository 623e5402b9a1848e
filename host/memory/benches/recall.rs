//! A seat's long memory at size: recall over N notes of one seat (the
//! per-seat scan ranked by `cosine_distance` in SQLite, and by recency),
//! p50/p99 over RUNS queries; then hydration of M diary rows of one seat
//! into a fresh store on a real nats-server (time, and the process's peak
//! RSS during the hydration: VmHWM reset just before it).
//!
//! `cargo bench -p crewlet-memory --bench recall --profile release`;
//! `NOTES=N` (default 10,000), `DIM=N` (default 256), `RUNS=N` (default
//! 200), `ROWS=N` hydrated (default 100,000; 0 skips it).

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{env, pct, peak_rss_kib, vector};
use crewlet_memory::{Diary, Memory};
use crewlet_store::{DiaryNote, Store};
use crewlet_testkit::NatsServer;

fn note(seat: &str, i: usize, dim: usize) -> DiaryNote {
    DiaryNote {
        seat: seat.into(),
        note_id: format!("019a-{i:07}.1"),
        text: format!(
            "Note {i}: the deploy of service {} went out at 14:02; the on-call was told.",
            i % 97
        ),
        turn_id: Some(format!("019a-{i:07}")),
        created_ms: 1_765_000_000_000 + i as i64,
        updated_ms: 1_765_000_000_000 + i as i64,
        vector: (dim > 0).then(|| vector(i, dim)),
        change_seq: 0,
    }
}

fn recall(notes: usize, dim: usize, runs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in(dir.path()).unwrap();
    let rows: Vec<DiaryNote> = (0..notes).map(|i| note("ada", i, dim)).collect();
    for chunk in rows.chunks(1_000) {
        store.apply_notes(chunk).unwrap();
    }
    // A second seat as large beside it: the scan is per seat.
    let other: Vec<DiaryNote> = (0..notes).map(|i| note("bob", i, dim)).collect();
    for chunk in other.chunks(1_000) {
        store.apply_notes(chunk).unwrap();
    }
    let (mut ranked, mut recent) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let q = vector(notes + r, dim);
        let t = Instant::now();
        let got = store.recall_notes("ada", Some(&q), 2.0, 5).unwrap();
        ranked.push(t.elapsed());
        assert_eq!(got.len(), 5);
        let t = Instant::now();
        let got = store.recall_notes("ada", None, 2.0, 5).unwrap();
        recent.push(t.elapsed());
        assert_eq!(got.len(), 5);
    }
    println!("recall over {notes} notes of one seat ({dim}-dim vectors), {runs} queries:");
    println!(
        "  ranked by cosine distance   p50 {:>9.2?}  p99 {:>9.2?}",
        pct(&mut ranked, 0.5),
        pct(&mut ranked, 0.99)
    );
    println!(
        "  by recency (no embedder)    p50 {:>9.2?}  p99 {:>9.2?}",
        pct(&mut recent, 0.5),
        pct(&mut recent, 0.99)
    );
}

fn hydrate(rows: usize, dim: usize) {
    let server = NatsServer::start();
    common::runtime().block_on(async {
        let js = common::stream(&server).await;
        let seed_dir = tempfile::tempdir().unwrap();
        let writer = Memory::open(js.clone())
            .await
            .unwrap()
            .with(Diary(Arc::new(Store::open_in(seed_dir.path()).unwrap())));
        let t = Instant::now();
        common::seed::<Diary>(&js, &writer, (0..rows).map(|i| note("ada", i, dim))).await;
        eprintln!("seeded {rows} diary rows in {:?}", t.elapsed());
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open_in(dir.path()).unwrap());
        let memory = Memory::open(js.clone())
            .await
            .unwrap()
            .with(Diary(store.clone()));
        // Reset the peak so it measures the hydration alone.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let before = peak_rss_kib();
        let t = Instant::now();
        let done = memory.hydrate("ada").await.unwrap();
        let took = t.elapsed();
        assert_eq!(done.written, rows as u64);
        println!(
            "hydrate {rows} diary rows ({dim}-dim vectors) into a fresh store: {took:.2?}, peak RSS {} MiB (was {} MiB before)",
            peak_rss_kib() / 1024,
            before / 1024
        );
    });
}

fn main() {
    let dim = env("DIM", 256);
    recall(env("NOTES", 10_000), dim, env("RUNS", 200));
    let rows = env("ROWS", 100_000);
    if rows > 0 {
        hydrate(rows, dim);
    }
}
