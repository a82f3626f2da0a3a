//! Who waits on a job: [`Waiters`] wakes the tasks waiting on a job (`"wait": true`, the
//! events stream, the OpenAI-compatible door) when its state changes, relays the pieces of text
//! a provider streams ([`Progress`]), and wakes the providers long-polling for work.
//!
//! The books are the truth: a waiter subscribes first, then reads the job from the books, and a
//! notification only tells it to read again, so a change between the two is never missed.

use alloy::primitives::B256;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// Notifications queued per job before a slow waiter misses some (it then re-reads the books,
/// which is all a notification asks of it).
const QUEUE: usize = 16;

/// Who waits on which job, who streams its text, and the providers waiting for work. Cheap to
/// clone.
#[derive(Clone, Debug, Default)]
pub struct Waiters {
    inner: Arc<Mutex<HashMap<B256, broadcast::Sender<()>>>>,
    texts: Arc<Mutex<HashMap<B256, broadcast::Sender<Progress>>>>,
    work: Arc<tokio::sync::Notify>,
}

/// A piece of a job's output as the provider streams it: `text` continues the output at byte
/// `offset`. Only relayed, never stored: the signed result is what counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of output before this piece.
    pub offset: usize,
    /// The piece.
    pub text: Arc<str>,
}

/// Pieces queued per streaming waiter before a slow one misses some (the final result fills
/// any gap).
const TEXT_QUEUE: usize = 256;

impl Waiters {
    /// Wakes every provider waiting in a pull (a job was committed).
    pub fn work_added(&self) {
        self.work.notify_waiters();
    }

    /// Resolves at the next [`Waiters::work_added`] (create it before looking for work, so a job
    /// committed in between is not missed).
    pub fn work(&self) -> tokio::sync::futures::Notified<'_> {
        self.work.notified()
    }

    /// A receiver woken at each change of job `id` (subscribe before reading the books).
    pub fn subscribe(&self, id: B256) -> broadcast::Receiver<()> {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id)
            .or_insert_with(|| broadcast::channel(QUEUE).0)
            .subscribe()
    }

    /// Wakes the waiters of job `id` (after its change is committed to the books).
    pub fn notify(&self, id: B256) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = map.get(&id)
            && sender.send(()).is_err()
        {
            // Nobody listens any more.
            map.remove(&id);
        }
    }

    /// A receiver of the pieces of job `id`'s output as its provider streams them.
    pub fn subscribe_text(&self, id: B256) -> broadcast::Receiver<Progress> {
        let mut map = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id)
            .or_insert_with(|| broadcast::channel(TEXT_QUEUE).0)
            .subscribe()
    }

    /// Relays a piece of job `id`'s output to whoever streams it (nobody: dropped).
    pub fn publish_text(&self, id: B256, progress: Progress) {
        let mut map = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sender) = map.get(&id)
            && sender.send(progress).is_err()
        {
            map.remove(&id);
        }
    }

    /// Forgets jobs whose waiters all left (a client that hung up), so the maps stay bounded by
    /// the waiters alive.
    pub fn prune(&self) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, sender| sender.receiver_count() > 0);
        drop(map);
        let mut texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        texts.retain(|_, sender| sender.receiver_count() > 0);
    }

    /// Jobs with live waiters.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no job has a waiter.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
