//! Durable pull consumers, created or adopted with the settings this
//! version wants.
//!
//! Rule: a consumer another node (or an older version) created is adopted,
//! and the settings that decide how long a stalled node holds work hostage
//! — the ack wait and how many deliveries may be in flight — are brought to
//! this version's values by an update, never left as found. Why: JetStream's
//! create returns an existing durable as it is, so a shortened ack wait
//! would otherwise reach only fleets that never ran the old one.

use std::time::Duration;

use async_nats::jetstream::consumer::{self, PullConsumer};
use async_nats::jetstream::stream::Stream;

/// How long a mailbox delivery may go unacknowledged before the broker
/// hands it to whoever pulls next. The holder acknowledges progress every
/// half of it while a turn runs, so only a stalled or dead holder lets it
/// lapse: the seat's next holder gets the wake within this after taking the
/// seat.
pub const MAILBOX_ACK_WAIT: Duration = Duration::from_secs(10);

/// The same for `notify-inbound`: its work is a parse and a few publishes,
/// kept alive by progress acks when slower, so a frozen node's deliveries
/// move to a peer within this.
pub const NOTIFY_ACK_WAIT: Duration = Duration::from_secs(5);

/// Why a consumer could not be created, read or updated.
#[derive(Debug, thiserror::Error)]
#[error("consumer {durable}: {detail}")]
pub struct ConsumerError {
    pub durable: String,
    pub detail: String,
}

/// Creates `config.durable_name` on `stream`, or adopts it and updates the
/// settings [`differs`] compares when they are not this version's.
pub async fn adopt(
    stream: &Stream,
    config: consumer::pull::Config,
) -> Result<PullConsumer, ConsumerError> {
    let durable = config.durable_name.clone().unwrap_or_default();
    let fail = |detail: String| ConsumerError {
        durable: durable.clone(),
        detail,
    };
    let found: PullConsumer = stream
        .get_or_create_consumer(&durable, config.clone())
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !differs(&found.cached_info().config, &config) {
        return Ok(found);
    }
    stream
        .update_consumer(config)
        .await
        .map_err(|e| fail(format!("cannot bring its settings to this version's: {e}")))
}

/// Whether the ack wait or the in-flight bound of `have` is not `want`'s.
fn differs(have: &consumer::Config, want: &consumer::pull::Config) -> bool {
    let max_ack_pending = |n: i64| if n <= 0 { -1 } else { n };
    have.ack_wait != want.ack_wait
        || (want.max_ack_pending != 0
            && max_ack_pending(have.max_ack_pending) != max_ack_pending(want.max_ack_pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_settings_that_hold_work_count() {
        let want = consumer::pull::Config {
            ack_wait: MAILBOX_ACK_WAIT,
            ..Default::default()
        };
        let mut have = consumer::Config {
            ack_wait: MAILBOX_ACK_WAIT,
            max_ack_pending: 1000,
            description: Some("another description".into()),
            ..Default::default()
        };
        assert!(!differs(&have, &want), "an unset bound adopts the broker's");
        have.ack_wait = Duration::from_secs(30);
        assert!(differs(&have, &want), "an old ack wait is updated");
        have.ack_wait = MAILBOX_ACK_WAIT;
        let bounded = consumer::pull::Config {
            max_ack_pending: 64,
            ..want
        };
        assert!(differs(&have, &bounded));
    }
}
