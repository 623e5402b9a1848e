//! The applier's batches: many records commit in one transaction with the
//! position of the last, so a batch cut mid-way (the estate's disk failing
//! under it, as a kill would) commits none of it, and the applier resumes
//! at the committed position and applies the batch once.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use common::{Node, js, tokens, until};
use crewlet_statelog::usage::Usage;
use crewlet_statelog::{
    Applier, ApplierParts, Change, Domain, DomainState, Incoming, Undecodable, Writes,
};
use crewlet_testkit::NatsServer;
use rusqlite::Connection;

/// The usage domain, whose disk fails while armed at the first record a
/// transaction applies after it already wrote one (a batch cut mid-way).
struct Failing {
    disk: Arc<Disk>,
}

struct Disk {
    armed: AtomicBool,
    /// Rows the failing transaction held when it failed (its own,
    /// uncommitted view).
    held_at_failure: AtomicI64,
}

/// A usage change written through the failing disk.
struct Cut {
    usage: Box<dyn Change>,
    disk: Arc<Disk>,
}

impl Change for Cut {
    fn write(&self, w: &mut Writes<'_>) -> rusqlite::Result<()> {
        let tx = w.tx();
        if self.disk.armed.load(Ordering::SeqCst) {
            let held: i64 = tx.query_row("SELECT COUNT(*) FROM usage_tokens", [], |r| r.get(0))?;
            // The cursor row is written at a batch's end: here it is the
            // committed position.
            let committed: i64 = tx.query_row(
                "SELECT COALESCE(MAX(position), 0) FROM statelog_cursor",
                [],
                |r| r.get(0),
            )?;
            if held > committed {
                self.disk.held_at_failure.store(held, Ordering::SeqCst);
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                    Some("the test's disk failed".into()),
                ));
            }
        }
        self.usage.write(w)
    }
}

impl Domain for Failing {
    fn name(&self) -> &'static str {
        Usage.name()
    }
    fn stream(&self) -> &'static str {
        Usage.stream()
    }
    fn prefix(&self) -> &'static str {
        Usage.prefix()
    }
    fn compacted(&self) -> bool {
        Usage.compacted()
    }
    fn max_age(&self) -> Option<Duration> {
        Usage.max_age()
    }
    fn decode(&self, record: &Incoming) -> Result<Box<dyn Change>, Undecodable> {
        Ok(Box::new(Cut {
            usage: Usage.decode(record)?,
            disk: self.disk.clone(),
        }))
    }
    fn age_out(&self, tx: &Connection, now_ms: i64) -> rusqlite::Result<()> {
        Usage.age_out(tx, now_ms)
    }
}

fn start(node: &Node, js: &async_nats::jetstream::Context, domain: &Arc<Failing>) -> Applier {
    Applier::start(ApplierParts {
        js: js.clone(),
        estate: node.estate.clone(),
        local: node.local.clone(),
        domain: domain.clone(),
        book: None,
        adopter: None,
        node: "n1".into(),
        replicas: 1,
    })
}

#[tokio::test]
async fn a_batch_cut_mid_way_commits_none_of_it_and_the_resume_applies_it_once() {
    let server = NatsServer::start();
    let (_c, js) = js(&server.url()).await;
    // The whole log is there before the applier starts, so its batches
    // hold many records each.
    let mut last = 0;
    for i in 0..2_000u64 {
        let o = tokens("n1", &format!("seat{i}"), i);
        last = crewlet_statelog::append(&js, &o.subject(), &o.record())
            .await
            .unwrap();
    }
    let node = Node::new();
    let domain = Arc::new(Failing {
        disk: Arc::new(Disk {
            armed: AtomicBool::new(true),
            held_at_failure: AtomicI64::new(-1),
        }),
    });
    let applier = start(&node, &js, &domain);
    let s = until(&applier, "the failing batch", |s| {
        matches!(s.state, DomainState::Unavailable { .. })
    })
    .await;
    applier.stop().await;
    let DomainState::Unavailable { reason } = &s.state else {
        unreachable!()
    };
    assert!(reason.contains("the test's disk failed"), "{reason}");
    let at = node.estate.cursor("usage").unwrap().position;
    let held = domain.disk.held_at_failure.load(Ordering::SeqCst);
    assert!(at < last, "the cut batch's position was committed ({at})");
    // The cut batch had written a row before it failed (a retry after
    // the backoff may have committed a batch of one since).
    assert!(held > 0, "no batch was cut ({held})");
    assert_eq!(
        node.count("SELECT COUNT(*) FROM usage_tokens"),
        at as i64,
        "rows of the cut batch were committed"
    );
    assert_eq!(node.count("SELECT COUNT(*) FROM statelog_ops"), at as i64);

    domain.disk.armed.store(false, Ordering::SeqCst);
    let applier = start(&node, &js, &domain);
    until(&applier, "all applied", |s| s.position >= last).await;
    applier.stop().await;
    assert_eq!(node.count("SELECT COUNT(*) FROM usage_tokens"), 2_000);
    assert_eq!(node.count("SELECT COUNT(*) FROM statelog_ops"), 2_000);
    assert_eq!(
        node.count("SELECT SUM(input_tokens) FROM usage_tokens"),
        (0..2_000).sum::<i64>()
    );
}
