//! [`TakeOnce`]: a handle that stopping takes out, once, through `&self`
//! (a task's or a thread's join handle, a "stopped" receiver).

use std::sync::{Mutex, PoisonError};

/// Holds a value until the first [`TakeOnce::take`].
pub(super) struct TakeOnce<T>(Mutex<Option<T>>);

impl<T> TakeOnce<T> {
    pub(super) fn new(value: T) -> Self {
        TakeOnce(Mutex::new(Some(value)))
    }

    /// Holds `value`, if there is one.
    pub(super) fn maybe(value: Option<T>) -> Self {
        TakeOnce(Mutex::new(value))
    }

    /// The value, the first time; `None` after.
    pub(super) fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl TakeOnce<std::thread::JoinHandle<()>> {
    /// Waits for the thread, the first time (on a blocking thread, not a
    /// runtime worker).
    pub(super) async fn join(&self) {
        if let Some(thread) = self.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

impl TakeOnce<tokio::task::JoinHandle<()>> {
    /// Waits for the task, the first time.
    pub(super) async fn join(&self) {
        if let Some(task) = self.take() {
            let _ = task.await;
        }
    }
}
