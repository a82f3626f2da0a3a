//! The batch scheduler: continuous batching over one [`Model`], whatever each sequence's
//! adapter, on its own thread.
//!
//! Each step admits waiting sequences whose adapter is resident (up to a batch size and a
//! prefill-token budget), runs **one** forward over every running sequence — a new sequence's
//! whole prompt, one token for the others — picks each sequence's next token, streams it out,
//! and drops finished sequences. Sequences thus join and leave at token boundaries, with any mix
//! of adapters and ranks in the batch.
//!
//! An adapter that is not resident is loaded from disk on a loader thread while the batch keeps
//! running; its sequences wait until the load lands in the residency cache. A running sequence
//! holds its adapter (it cannot be evicted under it).
//!
//! Conversation prefixes (SPEC §4): a chat-shaped request names the prefix it continues
//! ([`cx_protocol::prefix::continued_prefix_id`]); when the cache holds it (same adapter), the
//! sequence starts from the held KV cut to where the prompt's tokens depart from the held ones,
//! and prefills only the rest. Every position is computed by the same operations whatever was
//! prefilled with it (no reduction crosses rows), so the output is bit-identical to a run
//! without the hit in class D. A finished turn's KV is offered to the cache as the next prefix,
//! with s the prefill seconds it saves, measured here per prefilled token.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::decode::advance;
use super::sample::{choose, logprobs};
use super::{
    AdapterRef, EngineConfig, EngineStats, Event, FinishReason, GenerateRequest, Shared, lock,
};
use crate::cache::{HeldPrefix, PrefixDecision};
use crate::error::Error;
use crate::lora::{Adapter, load_adapter};
use crate::model::{KvCache, Model, SeqInput};
use crate::tokenizer::{Detokenizer, Tokenizer};

/// What the scheduler thread hears: requests from the handles, loads from its loader threads.
pub(super) enum Command {
    Generate(GenerateRequest),
    Loaded {
        id: String,
        seconds: f64,
        result: Result<Arc<Adapter>, Arc<Error>>,
    },
}

struct Waiting {
    request: GenerateRequest,
    /// The prefix id it continues, if chat-shaped.
    continues: Option<String>,
}

pub(super) struct Running {
    pub(super) request: GenerateRequest,
    adapter: Option<Arc<Adapter>>,
    pub(super) cache: KvCache,
    /// Prompt tokens already in `cache` when admitted (a held prefix's); prefill runs the rest.
    prompt_done: usize,
    /// The visible text when it finished (what the caller was sent), for the held prefix's id.
    pub(super) reply: Option<String>,
    /// The `Done` event of a finished sequence, sent after its turn is offered as a prefix.
    pub(super) done: Option<Event>,
    pub(super) generated: Vec<u32>,
    /// The text of `generated` so far (whole characters).
    pub(super) text: String,
    pub(super) detokenizer: Detokenizer,
    /// Text events of a request that does not stream, sent when it ends.
    pub(super) held: Vec<Event>,
    pub(super) emitted_bytes: usize,
    /// Bytes of the text already searched for stop strings (see `decode::advance`).
    pub(super) stop_scanned_bytes: usize,
    prefilled: bool,
    pub(super) finished: Option<FinishReason>,
    pub(super) cancelled: bool,
}

pub(super) struct Scheduler {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    shared: Arc<Shared>,
    config: EngineConfig,
    tx: Sender<Command>,
    waiting: VecDeque<Waiting>,
    running: Vec<Running>,
    loading: HashSet<String>,
    /// Loaded adapters that did not fit yet (everything else pinned or in use).
    pending_insert: HashMap<String, Arc<Adapter>>,
    stats: EngineStats,
    handles: Weak<()>,
    /// Seconds of forward per prefilled token (an exponential average over prefill steps): what
    /// turns a held prefix's length into s, the saving of a hit.
    prefill_s_per_token: Option<f64>,
}

fn label(adapter: &Option<AdapterRef>) -> String {
    adapter
        .as_ref()
        .map_or_else(|| "base".to_string(), |a| a.alias.clone())
}

impl Scheduler {
    pub(super) fn new(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        shared: Arc<Shared>,
        config: EngineConfig,
        tx: Sender<Command>,
        handles: Weak<()>,
    ) -> Self {
        Self {
            model,
            tokenizer,
            shared,
            config,
            tx,
            waiting: VecDeque::new(),
            running: Vec::new(),
            loading: HashSet::new(),
            pending_insert: HashMap::new(),
            stats: EngineStats::default(),
            handles,
            prefill_s_per_token: None,
        }
    }

    pub(super) fn run(mut self, rx: Receiver<Command>) {
        loop {
            // Block only when there is nothing to run; otherwise take what has arrived.
            let idle = self.running.is_empty();
            if idle {
                if self.waiting.is_empty() && self.handles.strong_count() == 0 {
                    return; // every Engine handle is gone and nothing is left to do
                }
                let wait = if self.waiting.is_empty() {
                    Duration::from_secs(1)
                } else {
                    Duration::from_millis(20)
                };
                match rx.recv_timeout(wait) {
                    Ok(command) => self.handle(command),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
                }
            }
            while let Ok(command) = rx.try_recv() {
                self.handle(command);
            }
            self.retry_pending_inserts();
            self.admit();
            if !self.running.is_empty() {
                self.step();
            }
            self.publish_stats();
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Generate(request) => {
                if let Some(adapter) = &request.adapter {
                    let now = self.shared.now_s();
                    // Counts the hit or miss and the use that values the adapter.
                    let _ = self.shared.cache().lookup(&adapter.id, now);
                }
                let continues = request.conversation.as_ref().and_then(|c| {
                    cx_protocol::prefix::continued_prefix_id(
                        &c.model,
                        request.adapter.as_ref().map(|a| a.id.as_str()),
                        &c.prompt_text,
                    )
                });
                if let Some(id) = &continues {
                    // Observed continuations are what γ is estimated from.
                    self.shared.cache().note_continuation(id);
                }
                self.waiting.push_back(Waiting { request, continues });
            }
            Command::Loaded {
                id,
                seconds,
                result,
            } => {
                self.loading.remove(&id);
                match result {
                    Ok(adapter) => {
                        self.shared
                            .cache()
                            .record_load_time(adapter.bytes(), seconds);
                        self.pending_insert.insert(id, adapter);
                        self.retry_pending_inserts();
                    }
                    Err(error) => self.fail_waiting(&id, error),
                }
            }
        }
    }

    fn fail_waiting(&mut self, id: &str, error: Arc<Error>) {
        self.waiting.retain(|w| {
            let matches = w.request.adapter.as_ref().is_some_and(|a| a.id == id);
            if matches {
                let _ = w.request.events.send(Event::Failed(error.clone()));
            }
            !matches
        });
    }

    fn retry_pending_inserts(&mut self) {
        if self.pending_insert.is_empty() {
            return;
        }
        let now = self.shared.now_s();
        let ids: Vec<String> = self.pending_insert.keys().cloned().collect();
        for id in ids {
            let wanted = self
                .waiting
                .iter()
                .any(|w| w.request.adapter.as_ref().is_some_and(|a| a.id == id));
            if !wanted {
                self.pending_insert.remove(&id);
                continue;
            }
            let adapter = self.pending_insert[&id].clone();
            let result = self.shared.cache().insert(adapter, false, now);
            match result {
                Ok(_) => {
                    self.pending_insert.remove(&id);
                }
                Err(Error::CacheFull { .. }) if !self.running.is_empty() => {
                    // Room frees when running sequences finish; try again next step.
                }
                Err(e) => {
                    self.pending_insert.remove(&id);
                    self.fail_waiting(&id, Arc::new(Error::NotAdmitted(Box::new(e))));
                }
            }
        }
    }

    fn start_load(&mut self, adapter: &AdapterRef) {
        if self.loading.contains(&adapter.id) || self.pending_insert.contains_key(&adapter.id) {
            return;
        }
        self.loading.insert(adapter.id.clone());
        let (tx, model, max_rank) = (self.tx.clone(), self.model.clone(), self.config.max_rank);
        let adapter = adapter.clone();
        let id = adapter.id.clone();
        // Loads run beside the batch, never inside a step.
        let spawned = std::thread::Builder::new()
            .name("cx-adapter-load".into())
            .spawn(move || {
                let t = Instant::now();
                let result = load_adapter(&adapter.dir, model.config(), max_rank)
                    .and_then(|loaded| {
                        if loaded.id() == adapter.id {
                            Ok(Arc::new(loaded))
                        } else {
                            Err(Error::AdapterChanged {
                                alias: adapter.alias.clone(),
                                dir: adapter.dir.clone(),
                                registered_id: adapter.id.clone(),
                                found_id: loaded.id().to_string(),
                            })
                        }
                    })
                    .map_err(Arc::new);
                let _ = tx.send(Command::Loaded {
                    id: adapter.id.clone(),
                    seconds: t.elapsed().as_secs_f64(),
                    result,
                });
            });
        if spawned.is_err() {
            self.loading.remove(&id);
        }
    }

    fn admit(&mut self) {
        let mut prefill_tokens = 0;
        let mut kept = VecDeque::new();
        while let Some(w) = self.waiting.pop_front() {
            if w.request.events.is_closed() {
                continue;
            }
            if self.running.len() >= self.config.max_batch_seqs {
                kept.push_back(w);
                continue;
            }
            let acquired = w
                .request
                .adapter
                .as_ref()
                .map(|a| self.shared.cache().acquire(&a.id));
            let adapter = match (acquired, &w.request.adapter) {
                (Some(Some(adapter)), _) => Some(adapter),
                (Some(None), Some(a)) => {
                    let a = a.clone();
                    self.start_load(&a);
                    kept.push_back(w);
                    continue;
                }
                _ => None,
            };
            let adapter_id = w.request.adapter.as_ref().map(|a| a.id.as_str());
            let reuse = w.continues.as_deref().map_or(0, |id| {
                self.shared
                    .cache()
                    .prefix_shared_len(id, adapter_id, &w.request.prompt)
            });
            let len = w.request.prompt.len() - reuse;
            if prefill_tokens > 0 && prefill_tokens + len > self.config.max_prefill_tokens {
                if let Some(a) = &w.request.adapter {
                    self.shared.cache().release(&a.id);
                }
                kept.push_back(w);
                continue;
            }
            let held = match &w.continues {
                Some(id) if reuse > 0 => self.held_prefix(id, &w.request, reuse),
                _ => None,
            };
            let prompt_done = held.as_ref().map_or(0, KvCache::len);
            prefill_tokens += w.request.prompt.len() - prompt_done;
            self.stats.prefix_reused_tokens += prompt_done as u64;
            self.running.push(Running {
                request: w.request,
                adapter,
                cache: held.unwrap_or_default(),
                prompt_done,
                reply: None,
                done: None,
                generated: Vec::new(),
                text: String::new(),
                detokenizer: Detokenizer::default(),
                held: Vec::new(),
                emitted_bytes: 0,
                stop_scanned_bytes: 0,
                prefilled: false,
                finished: None,
                cancelled: false,
            });
        }
        self.waiting = kept;
    }

    /// Takes the held KV of prefix `id` out of the cache for `request` (a hit), cut to its first
    /// `reuse` positions — what the prompt shares with it ([`ResidencyCache::prefix_shared_len`]).
    ///
    /// [`ResidencyCache::prefix_shared_len`]: crate::cache::ResidencyCache::prefix_shared_len
    fn held_prefix(
        &mut self,
        id: &str,
        request: &GenerateRequest,
        reuse: usize,
    ) -> Option<KvCache> {
        let adapter = request.adapter.as_ref().map(|a| a.id.as_str());
        let held = self.shared.cache().take_prefix(id, adapter)?;
        self.shared.residency_changed.notify_one();
        let mut kv = held.kv;
        kv.truncate(reuse);
        (kv.len() == reuse).then_some(kv)
    }

    /// s for a prefix of `tokens`: the prefill seconds a hit saves.
    fn saving_s(&self, tokens: usize) -> f64 {
        self.prefill_s_per_token.unwrap_or(0.0) * tokens as f64
    }

    /// Offers a prefix to the cache (kept iff γ·s > h) and says so when it is kept.
    fn offer(&mut self, prefix: HeldPrefix) {
        let now = self.shared.now_s();
        let decision = self.shared.cache().offer_prefix(prefix, now);
        if matches!(decision, PrefixDecision::Kept { .. }) {
            self.shared.residency_changed.notify_one();
        }
    }

    /// A finished turn's KV as the next prefix of its conversation: the tokens it holds (the
    /// prompt and what was generated, up to the last position run) under the id of the
    /// transcript the caller now has ([`cx_protocol::prefix::held_prefix_id`]).
    fn hold_finished(&mut self, r: Running) {
        let (Some(conversation), Some(reply)) = (&r.request.conversation, &r.reply) else {
            return;
        };
        let adapter = r.request.adapter.as_ref().map(|a| a.id.clone());
        let Some(id) = cx_protocol::prefix::held_prefix_id(
            &conversation.model,
            adapter.as_deref(),
            &conversation.prompt_text,
            reply,
        ) else {
            return;
        };
        let mut tokens = r.request.prompt.clone();
        tokens.extend_from_slice(&r.generated);
        tokens.truncate(r.cache.len());
        if tokens.len() != r.cache.len() {
            return; // never: every position run is a prompt or generated token
        }
        let prefix = HeldPrefix {
            id,
            adapter,
            saving_s: self.saving_s(tokens.len()),
            tokens,
            kv: r.cache,
        };
        self.offer(prefix);
    }

    /// One forward over the running sequences at `which` (sorted indices); a panic inside is
    /// caught and reported as an error, so one bad batch cannot stop the scheduler.
    fn forward(&mut self, which: &[usize]) -> Result<Vec<Vec<f32>>, Error> {
        let last_tokens: Vec<[u32; 1]> = self
            .running
            .iter()
            .map(|r| [r.generated.last().copied().unwrap_or(0)])
            .collect();
        let mut inputs: Vec<SeqInput<'_>> = self
            .running
            .iter_mut()
            .zip(&last_tokens)
            .enumerate()
            .filter(|(i, _)| which.binary_search(i).is_ok())
            .map(|(_, (r, last))| SeqInput {
                tokens: if r.prefilled {
                    &last[..]
                } else {
                    &r.request.prompt[r.prompt_done..]
                },
                cache: &mut r.cache,
                adapter: r.adapter.as_deref(),
            })
            .collect();
        let model = &self.model;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.forward(&mut inputs)))
        {
            Ok(Ok(logits)) => Ok(logits),
            Ok(Err(e)) => Err(Error::Generation {
                stage: "forward",
                cause: Box::new(e),
            }),
            Err(_) => Err(Error::ForwardPanicked),
        }
    }

    fn accept(&mut self, which: &[usize], logits: Vec<Vec<f32>>) {
        for (&i, logits) in which.iter().zip(logits) {
            let r = &mut self.running[i];
            r.prefilled = true;
            // The position the chosen token will take: every draw is keyed by it.
            let position = r.cache.len();
            let sampling = &r.request.sampling;
            let token = choose(&logits, sampling, &r.generated, position);
            let logprobs = sampling.logprobs.map(|top| logprobs(&logits, token, top));
            self.stats.generated_tokens += 1;
            advance(r, token, logprobs, &self.model, &self.tokenizer);
        }
    }

    fn fail(&mut self, i: usize, error: Error) {
        let r = &mut self.running[i];
        let _ = r.request.events.send(Event::Failed(Arc::new(error)));
        r.cancelled = true;
    }

    fn step(&mut self) {
        self.stats.steps += 1;
        self.stats.max_batch_seen = self.stats.max_batch_seen.max(self.running.len());
        let all: Vec<usize> = (0..self.running.len()).collect();
        let prefill_rows: usize = self
            .running
            .iter()
            .filter(|r| !r.prefilled)
            .map(|r| r.request.prompt.len() - r.prompt_done)
            .sum();
        let rows = prefill_rows + self.running.iter().filter(|r| r.prefilled).count();
        let started = Instant::now();
        let result = self.forward(&all);
        if prefill_rows > 0 && result.is_ok() {
            // Every row costs about the same forward; the average over the step is s per token.
            let per_token = started.elapsed().as_secs_f64() / rows as f64;
            self.prefill_s_per_token = Some(match self.prefill_s_per_token {
                Some(old) => 0.8 * old + 0.2 * per_token,
                None => per_token,
            });
        }
        match result {
            Ok(logits) => self.accept(&all, logits),
            Err(_) if all.len() > 1 => {
                // Isolate the failing sequence: the others run alone this step (the same bits
                // in class D) and carry on.
                for i in all {
                    match self.forward(&[i]) {
                        Ok(logits) => self.accept(&[i], logits),
                        Err(error) => self.fail(i, error),
                    }
                }
            }
            Err(error) => self.fail(0, error),
        }
        let mut kept = Vec::with_capacity(self.running.len());
        let mut finished = Vec::new();
        for r in std::mem::take(&mut self.running) {
            if r.finished.is_some() || r.cancelled {
                if let Some(a) = &r.request.adapter {
                    self.shared.cache().release(&a.id);
                }
                if r.finished.is_some() && !r.cancelled {
                    finished.push(r);
                }
            } else {
                kept.push(r);
            }
        }
        self.running = kept;
        let mut answers = Vec::with_capacity(finished.len());
        for mut r in finished {
            answers.push((r.done.take(), r.request.events.clone()));
            self.hold_finished(r);
        }
        // Counters first: a caller that hears `Done` reads them with this step counted.
        self.publish_stats();
        for (done, events) in answers {
            if let Some(done) = done {
                let _ = events.send(done);
            }
        }
    }

    fn publish_stats(&mut self) {
        let mut running = BTreeMap::new();
        for r in &self.running {
            *running.entry(label(&r.request.adapter)).or_insert(0) += 1;
        }
        let mut waiting = BTreeMap::new();
        for w in &self.waiting {
            *waiting.entry(label(&w.request.adapter)).or_insert(0) += 1;
        }
        self.stats.running = running;
        self.stats.waiting = waiting;
        *lock(&self.shared.stats) = self.stats.clone();
    }
}
