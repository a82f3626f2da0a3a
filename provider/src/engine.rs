//! The batch scheduler: continuous batching over one [`Model`], whatever each sequence's
//! adapter, on its own thread.
//!
//! Requests arrive on a channel. Each step the scheduler admits waiting sequences whose adapter
//! is resident (up to a batch size and a prefill-token budget), runs **one** forward over every
//! running sequence — a new sequence's whole prompt, one token for the others — picks each
//! sequence's next token, streams it out, and drops finished sequences. Sequences thus join and
//! leave at token boundaries, with any mix of adapters and ranks in the batch.
//!
//! An adapter that is not resident is loaded from disk on a loader thread while the batch keeps
//! running; its sequences wait until the load lands in the [`ResidencyCache`]. A running
//! sequence holds its adapter (it cannot be evicted under it).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cx_kernels::rng::{ChaCha20Rng, Rng, Standard, seeded};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::cache::ResidencyCache;
use crate::error::Error;
use crate::lora::{Adapter, load_adapter};
use crate::model::{KvCache, Model, SeqInput};
use crate::tokenizer::{Tokenizer, stable_prefix};

/// Which adapter a request uses, resolved by the HTTP layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterRef {
    /// Content id (SHA-256).
    pub id: String,
    /// The name it was asked for by (for metrics).
    pub alias: String,
    /// Where to load it from on a miss.
    pub dir: PathBuf,
}

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy (argmax, lowest id on ties; determinism class D). Otherwise softmax at this
    /// temperature, sampled from a generator seeded with `seed`.
    pub temperature: f32,
    /// Seed of the sampler.
    pub seed: u64,
}

/// One generation request.
#[derive(Debug)]
pub struct GenerateRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Its adapter, if any.
    pub adapter: Option<AdapterRef>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Stop strings: generation ends before the first one.
    pub stop: Vec<String>,
    /// Next-token choice.
    pub sampling: Sampling,
    /// Where the events go; a closed receiver cancels the sequence.
    pub events: UnboundedSender<Event>,
}

/// Why a sequence ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
}

/// What a request hears back.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text (may be empty when a token completes nothing printable yet).
    Text {
        /// The new text.
        delta: String,
        /// The token just chosen.
        token: u32,
    },
    /// The sequence ended.
    Done {
        /// Why.
        finish_reason: FinishReason,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
    },
    /// The request failed (adapter load error, forward error).
    Failed {
        /// HTTP status the API should answer with.
        status: u16,
        /// Why.
        message: String,
    },
}

/// Limits of the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// Sequences in one batch at most.
    pub max_batch_seqs: usize,
    /// Prompt tokens admitted per step at most (a longer prompt is admitted alone).
    pub max_prefill_tokens: usize,
    /// Largest LoRA rank accepted.
    pub max_rank: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_batch_seqs: 64,
            max_prefill_tokens: 2048,
            max_rank: 64,
        }
    }
}

/// Running and waiting sequences by adapter, for `/metrics`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct EngineStats {
    /// Running sequences per adapter alias (`base` for none).
    pub running: BTreeMap<String, usize>,
    /// Waiting sequences per adapter alias.
    pub waiting: BTreeMap<String, usize>,
    /// Forward steps run.
    pub steps: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Largest batch seen (sequences).
    pub max_batch_seen: usize,
}

/// State the scheduler shares with the HTTP layer.
#[derive(Debug)]
pub struct Shared {
    /// The residency cache.
    pub cache: Mutex<ResidencyCache>,
    /// Latest scheduler counters.
    pub stats: Mutex<EngineStats>,
    start: Instant,
}

impl Shared {
    /// Seconds since the engine started (the cache's clock).
    pub fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    /// The cache, locked (a poisoned lock still holds consistent data: every update is a
    /// single assignment sequence that cannot panic halfway in practice).
    pub fn cache(&self) -> MutexGuard<'_, ResidencyCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

enum Command {
    Generate(GenerateRequest),
    Loaded {
        id: String,
        seconds: f64,
        result: Result<Arc<Adapter>, String>,
    },
}

/// Handle to the scheduler thread.
#[derive(Clone, Debug)]
pub struct Engine {
    tx: Sender<Command>,
    shared: Arc<Shared>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    /// The scheduler holds a `Weak` of this: when the last handle is gone and nothing is
    /// left to run, the thread ends (its own sender for loader threads keeps the channel open).
    _alive: Arc<()>,
}

impl Engine {
    /// Starts the scheduler thread over `model`.
    pub fn start(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        cache: ResidencyCache,
        config: EngineConfig,
    ) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let alive = Arc::new(());
        let shared = Arc::new(Shared {
            cache: Mutex::new(cache),
            stats: Mutex::new(EngineStats::default()),
            start: Instant::now(),
        });
        let scheduler = Scheduler {
            model: model.clone(),
            tokenizer: tokenizer.clone(),
            shared: shared.clone(),
            config,
            tx: tx.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            loading: HashSet::new(),
            pending_insert: HashMap::new(),
            stats: EngineStats::default(),
            handles: Arc::downgrade(&alive),
        };
        std::thread::Builder::new()
            .name("cx-scheduler".into())
            .spawn(move || scheduler.run(rx))
            .expect("spawning the scheduler thread");
        Self {
            tx,
            shared,
            model,
            tokenizer,
            _alive: alive,
        }
    }

    /// Queues a request; events arrive on its channel.
    pub fn submit(&self, request: GenerateRequest) {
        if let Err(std::sync::mpsc::SendError(Command::Generate(request))) =
            self.tx.send(Command::Generate(request))
        {
            let _ = request.events.send(Event::Failed {
                status: 503,
                message: "the scheduler has stopped".into(),
            });
        }
    }

    /// Shared state (cache, counters).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }
}

struct Waiting {
    request: GenerateRequest,
}

struct Running {
    request: GenerateRequest,
    adapter: Option<Arc<Adapter>>,
    cache: KvCache,
    generated: Vec<u32>,
    emitted_bytes: usize,
    prefilled: bool,
    rng: ChaCha20Rng,
    finished: Option<FinishReason>,
    cancelled: bool,
}

struct Scheduler {
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
    handles: std::sync::Weak<()>,
}

fn label(adapter: &Option<AdapterRef>) -> String {
    adapter
        .as_ref()
        .map_or_else(|| "base".to_string(), |a| a.alias.clone())
}

impl Scheduler {
    fn run(mut self, rx: Receiver<Command>) {
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
                self.waiting.push_back(Waiting { request });
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
                    Err(message) => self.fail_waiting(&id, 422, &message),
                }
            }
        }
    }

    fn fail_waiting(&mut self, id: &str, status: u16, message: &str) {
        self.waiting.retain(|w| {
            let matches = w.request.adapter.as_ref().is_some_and(|a| a.id == id);
            if matches {
                let _ = w.request.events.send(Event::Failed {
                    status,
                    message: message.to_string(),
                });
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
                    self.fail_waiting(&id, 503, &e.to_string());
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
                    .map_err(|e| e.to_string())
                    .and_then(|loaded| {
                        if loaded.id() == adapter.id {
                            Ok(Arc::new(loaded))
                        } else {
                            Err(format!(
                                "adapter files in {} changed since `{}` was registered \
                                 (id {} now {}); load it again",
                                adapter.dir.display(),
                                adapter.alias,
                                adapter.id,
                                loaded.id()
                            ))
                        }
                    });
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
            let len = w.request.prompt.len();
            if prefill_tokens > 0 && prefill_tokens + len > self.config.max_prefill_tokens {
                if let Some(a) = &w.request.adapter {
                    self.shared.cache().release(&a.id);
                }
                kept.push_back(w);
                continue;
            }
            prefill_tokens += len;
            let seed = w.request.sampling.seed;
            self.running.push(Running {
                request: w.request,
                adapter,
                cache: KvCache::default(),
                generated: Vec::new(),
                emitted_bytes: 0,
                prefilled: false,
                rng: seeded(seed),
                finished: None,
                cancelled: false,
            });
        }
        self.waiting = kept;
    }

    /// One forward over the running sequences at `which` (sorted indices); a panic inside is
    /// caught and reported as an error, so one bad batch cannot stop the scheduler.
    fn forward(&mut self, which: &[usize]) -> Result<Vec<Vec<f32>>, String> {
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
                    &r.request.prompt[..]
                },
                cache: &mut r.cache,
                adapter: r.adapter.as_deref(),
            })
            .collect();
        let model = &self.model;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.forward(&mut inputs)))
        {
            Ok(Ok(logits)) => Ok(logits),
            Ok(Err(e)) => Err(format!("forward failed: {e}")),
            Err(_) => Err("forward panicked (a bug; see the provider's log)".into()),
        }
    }

    fn accept(&mut self, which: &[usize], logits: Vec<Vec<f32>>) {
        for (&i, logits) in which.iter().zip(logits) {
            let r = &mut self.running[i];
            r.prefilled = true;
            let token = choose(&logits, r.request.sampling, &mut r.rng);
            self.stats.generated_tokens += 1;
            advance(r, token, &self.model, &self.tokenizer);
        }
    }

    fn fail(&mut self, i: usize, message: String) {
        let r = &mut self.running[i];
        let _ = r.request.events.send(Event::Failed {
            status: 500,
            message,
        });
        r.cancelled = true;
    }

    fn step(&mut self) {
        self.stats.steps += 1;
        self.stats.max_batch_seen = self.stats.max_batch_seen.max(self.running.len());
        let all: Vec<usize> = (0..self.running.len()).collect();
        match self.forward(&all) {
            Ok(logits) => self.accept(&all, logits),
            Err(_) if all.len() > 1 => {
                // Isolate the failing sequence: the others run alone this step (the same bits
                // in class D) and carry on.
                for i in all {
                    match self.forward(&[i]) {
                        Ok(logits) => self.accept(&[i], logits),
                        Err(message) => self.fail(i, message),
                    }
                }
            }
            Err(message) => self.fail(0, message),
        }
        let mut kept = Vec::with_capacity(self.running.len());
        for r in self.running.drain(..) {
            if r.finished.is_some() || r.cancelled {
                if let Some(a) = &r.request.adapter {
                    self.shared.cache().release(&a.id);
                }
            } else {
                kept.push(r);
            }
        }
        self.running = kept;
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
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()) = self.stats.clone();
    }
}

/// Greedy: the lowest id among the largest logits. Sampling: softmax at the temperature.
fn choose(logits: &[f32], sampling: Sampling, rng: &mut ChaCha20Rng) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    if sampling.temperature <= 0.0 {
        return best as u32;
    }
    let max = logits[best];
    let weights: Vec<f64> = logits
        .iter()
        .map(|&v| f64::from((v - max) / sampling.temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    // Uniform in [0, 1) from 53 random bits (rand's `Standard` for f64).
    let u: f64 = rng.sample::<f64, _>(Standard) * total;
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if u < acc {
            return i as u32;
        }
    }
    best as u32
}

/// Appends `token`, streams the new text, and decides whether the sequence ends.
fn advance(r: &mut Running, token: u32, model: &Model, tokenizer: &Tokenizer) {
    let config = model.config();
    let eos = config.eos_ids().contains(&token);
    if !eos {
        r.generated.push(token);
    }
    let text = match tokenizer.decode(&r.generated) {
        Ok(text) => text,
        Err(e) => {
            let _ = r.request.events.send(Event::Failed {
                status: 500,
                message: e.to_string(),
            });
            r.cancelled = true;
            return;
        }
    };
    let mut finish = eos.then_some(FinishReason::Stop);
    let mut visible = text.as_str();
    if let Some(cut) = r
        .request
        .stop
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
    {
        visible = &text[..cut];
        finish = Some(FinishReason::Stop);
    }
    if finish.is_none()
        && (r.generated.len() >= r.request.max_tokens
            || r.cache.len() + 1 >= config.max_position_embeddings)
    {
        finish = Some(FinishReason::Length);
    }
    let stable = if finish.is_some() {
        visible
    } else {
        // Hold back a tail that may be the start of a stop string, so streamed text never
        // shows what the non-streamed answer cuts.
        let stable = stable_prefix(visible);
        let held = r
            .request
            .stop
            .iter()
            .map(|stop| partial_stop_len(stable, stop))
            .max()
            .unwrap_or(0);
        &stable[..stable.len() - held]
    };
    let delta = stable.get(r.emitted_bytes..).unwrap_or("").to_string();
    r.emitted_bytes = r.emitted_bytes.max(stable.len());
    if r.request.events.send(Event::Text { delta, token }).is_err() {
        r.cancelled = true;
        return;
    }
    if let Some(reason) = finish {
        let _ = r.request.events.send(Event::Done {
            finish_reason: reason,
            prompt_tokens: r.request.prompt.len(),
            completion_tokens: r.generated.len() + usize::from(eos),
        });
        r.finished = Some(reason);
    }
}

/// Length of the longest proper prefix of `stop` that `text` ends with (0 if none).
fn partial_stop_len(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .filter(|&k| stop.is_char_boundary(k))
        .find(|&k| text.ends_with(&stop[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::partial_stop_len;

    #[test]
    fn holds_back_a_possible_stop_prefix() {
        assert_eq!(partial_stop_len("hello wo", "world"), 2);
        assert_eq!(partial_stop_len("hello", "world"), 0);
        assert_eq!(partial_stop_len("say ##", "###"), 2);
        assert_eq!(partial_stop_len("é", "éx"), "é".len());
    }
}
