//! Everywhere the node keeps or says anything, searched for the needles.
//!
//! Each search records what it looked at (so an empty search cannot pass
//! as a clean one) and every hit as a place: a file and offset, a log file
//! and line, an event's seq, a stream's sequence or a bucket's key. A place
//! names the secret and the form, never the value.

use std::path::{Path, PathBuf};

use futures::StreamExt;

use super::forms::{Hit, Needles};
use crate::common::http;

/// What was searched, and what was found.
pub struct Sweep<'a> {
    needles: &'a Needles,
    pub hits: Vec<String>,
    pub log_lines: usize,
    pub events: usize,
    pub files: Vec<PathBuf>,
    pub messages: usize,
    pub streams: Vec<String>,
    pub keys: usize,
}

impl<'a> Sweep<'a> {
    pub fn new(needles: &'a Needles) -> Sweep<'a> {
        Sweep {
            needles,
            hits: Vec::new(),
            log_lines: 0,
            events: 0,
            files: Vec::new(),
            messages: 0,
            streams: Vec::new(),
            keys: 0,
        }
    }

    fn check(&mut self, place: impl FnOnce() -> String, bytes: &[u8]) {
        if let Some(Hit {
            secret,
            form,
            offset,
        }) = self.needles.find(bytes)
        {
            self.hits
                .push(format!("{}: {secret} as {form} at byte {offset}", place()));
        }
    }

    /// Every line of a captured log (stdout and stderr of one process).
    pub fn log(&mut self, file: &Path) {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
            self.log_lines += 1;
            self.check(|| format!("{} line {}", file.display(), n + 1), line);
        }
    }

    /// What a command printed.
    pub fn output(&mut self, what: &str, text: &str) {
        self.check(|| what.to_owned(), text.as_bytes());
    }

    /// Every file under `dir`, as bytes.
    pub fn files(&mut self, dir: &Path) {
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(bytes) = std::fs::read(&path) {
                    self.check(|| path.display().to_string(), &bytes);
                    self.files.push(path);
                }
            }
        }
    }

    /// Every row of the node's event log through `GET /events`, paged.
    pub fn events_api(&mut self, api: &str) {
        let mut before = String::new();
        loop {
            let page = http::get(api, &format!("/events?limit=1000{before}"))
                .expect("GET /events")
                .json();
            let rows = page["events"].as_array().cloned().unwrap_or_default();
            let Some(last) = rows.last() else { return };
            before = format!("&before_seq={}", last["seq"]);
            for row in &rows {
                self.events += 1;
                let place = || format!("event seq {} ({})", row["seq"], row["type"]);
                self.check(place, row.to_string().as_bytes());
            }
        }
    }

    /// An API answer.
    pub fn answer(&mut self, api: &str, path: &str) {
        let r = http::get(api, path).unwrap_or_else(|e| panic!("GET {path}: {e}"));
        self.check(|| format!("GET {path}"), &r.body);
    }

    /// Every message of every stream (`KV_*` included) and every key of
    /// every bucket, through the broker.
    pub async fn broker(&mut self, client: async_nats::Client) {
        let js = async_nats::jetstream::new(client);
        let names: Vec<String> = js
            .stream_names()
            .map(|n| n.expect("list the streams"))
            .collect()
            .await;
        for name in names {
            self.stream(&js, &name).await;
            if let Some(bucket) = name.strip_prefix("KV_") {
                self.bucket(&js, bucket).await;
            }
            self.streams.push(name);
        }
    }

    async fn stream(&mut self, js: &async_nats::jetstream::Context, name: &str) {
        let stream = js.get_stream(name).await.expect("open a listed stream");
        let state = &stream.cached_info().state;
        for seq in state.first_sequence..=state.last_sequence {
            // A gap is a message the stream already dropped (acked, purged).
            let Ok(msg) = stream.get_raw_message(seq).await else {
                continue;
            };
            self.messages += 1;
            let place = || format!("stream {name} seq {seq} ({})", msg.subject);
            let headers = format!("{:?}", msg.headers);
            let mut all = msg.subject.as_bytes().to_vec();
            all.extend_from_slice(headers.as_bytes());
            all.push(b'\n');
            all.extend_from_slice(&msg.payload);
            self.check(place, &all);
        }
    }

    async fn bucket(&mut self, js: &async_nats::jetstream::Context, bucket: &str) {
        let kv = js
            .get_key_value(bucket)
            .await
            .expect("open a listed bucket");
        let keys: Vec<String> = kv
            .keys()
            .await
            .expect("list a bucket's keys")
            .filter_map(|k| async move { k.ok() })
            .collect()
            .await;
        for key in keys {
            self.keys += 1;
            let value = kv.get(&key).await.ok().flatten().unwrap_or_default();
            let mut all = key.as_bytes().to_vec();
            all.push(b'\n');
            all.extend_from_slice(&value);
            self.check(|| format!("bucket {bucket} key {key}"), &all);
        }
    }
}
