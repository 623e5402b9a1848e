//! The estate in a backup, against a real nats-server: the copy is taken
//! with the log pinned at the estate's position, the pin is let go after
//! (and one never let go lapses), and a restore installs the copy with its
//! positions moved onto the restored log, refusing a data dir that holds
//! an estate already.

use crate::common;

use common::{Node, book, js, tokens, until};
use crewlet_statelog::backup::{pin_and_copy, restore, unpin};
use crewlet_statelog::{Estate, append};
use crewlet_testkit::NatsServer;

#[tokio::test]
async fn a_backup_pins_the_log_while_it_copies_and_a_restore_moves_the_positions() {
    let server = NatsServer::start();
    let (client, js) = js(&server.url()).await;
    let book = book(&client, "n1").await;
    let a = Node::new();
    let applier = a.applier(&js, "n1", None, None);
    let mut last = 0;
    for i in 0..5 {
        let o = tokens("n1", &format!("s{i}"), i + 1);
        last = append(&js, &o.subject(), &o.record()).await.unwrap();
    }
    until(&applier, "applied", |s| s.position >= last).await;

    let file = a.path().join("copy.sqlite3");
    let positions = pin_and_copy(&a.estate, &book, &["usage"], "backup-1", &file)
        .await
        .unwrap();
    assert_eq!(positions.of("usage"), last);
    let pins = book.pins("usage").await.unwrap();
    assert_eq!(pins.get("backup-1"), Some(&last), "pinned while it runs");
    unpin(&book, &["usage"], "backup-1").await;
    assert!(book.pins("usage").await.unwrap().is_empty(), "let go after");

    // A copy that cannot be written lets go of its pin too.
    let err = pin_and_copy(&a.estate, &book, &["usage"], "backup-2", &file).await;
    assert!(err.is_err(), "the copy's file exists already");
    assert!(book.pins("usage").await.unwrap().is_empty(), "{err:?}");

    // A pin past its lapse no longer counts (a backup that crashed).
    book.pin_until("usage", "crashed", 1, crewlet_os::now_ms() - 1)
        .await
        .unwrap();
    book.pin_until("usage", "running", 2, crewlet_os::now_ms() + 60_000)
        .await
        .unwrap();
    let pins = book.pins("usage").await.unwrap();
    assert_eq!(pins.keys().collect::<Vec<_>>(), vec!["running"]);

    // Restored where the log's records land two places lower.
    let target = tempfile::tempdir().unwrap();
    let installed = restore(&file, target.path(), &|_, p| p - 2).unwrap();
    assert_eq!(installed.of("usage"), last - 2);
    let restored = Estate::open_in(target.path()).unwrap();
    let cursor = restored.cursor("usage").unwrap();
    assert_eq!((cursor.position, cursor.record_ns), (last - 2, 0));
    let rows: i64 = restored
        .reader()
        .unwrap()
        .query_row("SELECT SUM(input_tokens) FROM usage_tokens", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(rows, 15, "every row is in the restored estate");
    let err = restore(&file, target.path(), &|_, p| p).unwrap_err();
    assert!(
        err.to_string().contains("fresh or emptied data dir"),
        "{err}"
    );
    applier.stop().await;
}
