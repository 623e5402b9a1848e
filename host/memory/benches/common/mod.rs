//! What the memory benches share: their knobs, percentiles, peak RSS, and
//! a real nats-server's memory stream seeded with rows.

#![allow(dead_code)]

use std::time::Duration;

use async_nats::jetstream;
use crewlet_memory::{Memory, Table};
use crewlet_testkit::NatsServer;

/// The knob `name` from the environment, or `default`.
pub fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic vector for `i` (an LCG: no extra dependency).
pub fn values(i: usize, dim: usize) -> Vec<f32> {
    let mut x = (i as u64)
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..dim)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// [`values`] as a stored vector of the benches' model, `bench/lcg`.
pub fn vector(i: usize, dim: usize) -> crewlet_store::Vector {
    crewlet_store::Vector {
        model: "bench/lcg".into(),
        values: values(i, dim),
    }
}

/// The `p` percentile of `v` (sorted here).
pub fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The process's peak resident set (VmHWM), in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A two-worker runtime, as a small node has.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// JetStream on `server`, with the node's streams made.
pub async fn stream(server: &NatsServer) -> jetstream::Context {
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    crewlet_stream::streams::ensure_streams(&js, 1)
        .await
        .unwrap();
    js
}

/// Publishes `rows` of table `T` through `writer`, the acks awaited a
/// window of 500 at a time (the context bounds the acks in flight).
pub async fn seed<T: Table>(
    js: &jetstream::Context,
    writer: &Memory,
    rows: impl IntoIterator<Item = T::Row>,
) {
    let mut acks = Vec::with_capacity(500);
    for row in rows {
        let e = writer.encode::<T>(&row).unwrap();
        acks.push(js.publish(e.subject, e.payload).await.unwrap());
        if acks.len() == 500 {
            for a in acks.drain(..) {
                a.await.unwrap();
            }
        }
    }
    for a in acks {
        a.await.unwrap();
    }
}
