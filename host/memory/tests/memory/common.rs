//! What every module here starts from: a real store file, and a changelog
//! on a real nats-server with the node's streams made.

use std::sync::Arc;

use async_nats::jetstream;
use crewlet_memory::Memory;
use crewlet_store::Store;
use crewlet_testkit::NatsServer;

/// A store in a fresh directory (kept while the `TempDir` lives).
pub(crate) fn store() -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open_in(dir.path()).unwrap());
    (dir, store)
}

/// The changelog on `server`, no tables yet (`with` adds them).
pub(crate) async fn changelog(server: &NatsServer) -> Memory {
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    crewlet_stream::streams::ensure_streams(&js, 1)
        .await
        .unwrap();
    Memory::open(js).await.unwrap()
}
