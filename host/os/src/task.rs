//! A background task with an explicit stop: a stop signal the task's loop
//! watches, and the handle its stopper awaits, so a stopped task has ended
//! (its last step finished) before the stopper goes on.

use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A spawned loop and its stop signal; end it with [`Stoppable::stop`].
pub struct Stoppable {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Stoppable {
    /// Spawns `run` with the receiver it must watch (`true`: stop now).
    pub fn spawn<F, Fut>(run: F) -> Stoppable
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(stopped));
        Stoppable { stop, task }
    }

    /// Signals the stop and waits for the task to end.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
