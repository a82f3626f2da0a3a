//! Dispatch: jobs to providers and their outcomes back to whoever waits on them.
//!
//! Providers will take signed assignments over their own outbound connections (the exchange
//! never reaches into a provider's network; the providers' issue). What every caller already
//! needs is here: [`Waiters`], which wakes the tasks waiting on a job (`"wait": true`, the
//! events stream, the OpenAI-compatible door) when its state changes, and [`run_deadlines`], the
//! sweep that expires jobs no one finished by their deadline and returns their holds.
//!
//! The books are the truth: a waiter subscribes first, then reads the job from the books, and a
//! notification only tells it to read again, so a change between the two is never missed.

use crate::books::Books;
use alloy::primitives::B256;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// States a job never leaves.
pub const TERMINAL: [&str; 5] = ["done", "expired", "failed", "cancelled", "settled"];

/// Whether `status` is one a job never leaves.
pub fn is_terminal(status: &str) -> bool {
    TERMINAL.contains(&status)
}

/// Notifications queued per job before a slow waiter misses some (it then re-reads the books,
/// which is all a notification asks of it).
const QUEUE: usize = 16;

/// Who waits on which job. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Waiters {
    inner: Arc<Mutex<HashMap<B256, broadcast::Sender<()>>>>,
}

impl Waiters {
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

    /// Forgets jobs whose waiters all left (a client that hung up), so the map stays bounded by
    /// the waiters alive.
    pub fn prune(&self) {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, sender| sender.receiver_count() > 0);
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

/// How often the deadline sweep runs: a job's hold returns at most this long after its deadline.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// Expires, every [`SWEEP_PERIOD`], the jobs whose deadline passed with no result (their holds
/// return to their tabs and sessions; nothing is charged) and wakes their waiters. Runs until
/// the task is dropped; a failed sweep is logged and retried at the next tick.
pub async fn run_deadlines(books: Books, waiters: Waiters) {
    let mut tick = tokio::time::interval(SWEEP_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match books.expire_due(crate::intake::now_s()).await {
            Ok(expired) => {
                for id in expired {
                    tracing::info!(job = %id, "expired: no result by the deadline; hold released");
                    waiters.notify(id);
                }
            }
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "deadline sweep failed"),
        }
        waiters.prune();
    }
}

/// What a provider returned for an inference job, as the books keep it in the job's `result`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// The generated text.
    pub text: String,
    /// `stop` (an end token or a stop sequence) or `length` (`max_tokens` reached).
    pub finish_reason: String,
    /// Tokens of the prompt, as the provider's tokenizer counted them.
    pub prompt_tokens: u32,
    /// Tokens generated.
    pub completion_tokens: u32,
}
