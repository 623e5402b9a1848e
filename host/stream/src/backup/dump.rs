//! One stream to a file of its messages and back: a line per message,
//! `{subject, headers, data}` (data in base64), in stream order.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::BackupError;

/// How long one message of a dump may take to arrive.
const NEXT_WITHIN: Duration = Duration::from_secs(10);

#[derive(Serialize, Deserialize)]
struct Line {
    subject: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    headers: Vec<(String, String)>,
    data: String,
    /// The message's position on the stream it was read from (absent in
    /// artefacts written before positions were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
}

/// Headers a restore must not send again: the broker stamps them, and
/// some (an expected sequence) would refuse the publish.
fn kept(name: &str) -> bool {
    !name.starts_with("Nats-Expected") && name != "Nats-Msg-Id"
}

/// Every message of `stream` up to its last sequence when the read began,
/// as lines; answers them and how many.
pub async fn dump_stream(
    js: &jetstream::Context,
    stream: &str,
) -> Result<(Vec<u8>, u64), BackupError> {
    let fail = |detail: String| BackupError::Read {
        stream: stream.to_owned(),
        detail,
    };
    let mut s = js
        .get_stream(stream)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let state = s
        .info()
        .await
        .map_err(|e| fail(e.to_string()))?
        .state
        .clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return Ok((out, 0));
    }
    let consumer = s
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut messages = consumer.messages().await.map_err(|e| fail(e.to_string()))?;
    let mut n = 0;
    loop {
        let msg = match tokio::time::timeout(NEXT_WITHIN, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(fail(e.to_string())),
            Ok(None) => return Err(fail("the read ended early".into())),
            Err(_) => return Err(fail(format!("no message within {NEXT_WITHIN:?}"))),
        };
        let seq = msg.info().map_err(|e| fail(e.to_string()))?.stream_sequence;
        if seq > state.last_sequence {
            break;
        }
        let mut headers: Vec<(String, String)> = msg
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .filter(|(k, _)| kept(k.as_ref()))
            .flat_map(|(k, vs)| {
                vs.iter()
                    .map(move |v| (k.to_string(), v.as_str().to_owned()))
            })
            .collect();
        headers.sort();
        let line = Line {
            subject: msg.subject.to_string(),
            headers,
            data: STANDARD.encode(&msg.payload),
            seq: Some(seq),
        };
        serde_json::to_writer(&mut out, &line).expect("a line serialises");
        out.push(b'\n');
        n += 1;
        if seq >= state.last_sequence {
            break;
        }
    }
    Ok((out, n))
}

/// Publishes every line of `dump` back onto `stream` (which must exist),
/// each acknowledged before the next; answers how many.
pub async fn load_stream(
    js: &jetstream::Context,
    stream: &str,
    dump: &[u8],
) -> Result<u64, BackupError> {
    let fail = |detail: String| BackupError::Restore {
        stream: stream.to_owned(),
        detail,
    };
    js.get_stream(stream)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut n = 0;
    for text in dump.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line: Line = serde_json::from_slice(text).map_err(|e| fail(e.to_string()))?;
        let data = STANDARD
            .decode(&line.data)
            .map_err(|e| fail(e.to_string()))?;
        let mut headers = HeaderMap::new();
        for (k, v) in &line.headers {
            headers.append(k.as_str(), v.as_str());
        }
        js.publish_with_headers(line.subject, headers, data.into())
            .await
            .map_err(|e| fail(e.to_string()))?
            .await
            .map_err(|e| fail(e.to_string()))?;
        n += 1;
    }
    Ok(n)
}

/// Where the record at position `old` of the dumped stream lands when
/// `dump` is published back onto a stream that held `base` records: the
/// count of dumped messages at or before `old`, past `base`. `None` when a
/// line does not say its position (an older artefact): replay it all.
pub fn restored_position(dump: &[u8], base: u64, old: u64) -> Option<u64> {
    let mut n = 0;
    for text in dump.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let line: Line = serde_json::from_slice(text).ok()?;
        if line.seq? <= old {
            n += 1;
        }
    }
    Some(base + n)
}
