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

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use cx_kernels::rng::{ChaCha20Rng, seeded};

use super::decode::{advance, choose};
use super::{
    AdapterRef, EngineConfig, EngineStats, Event, FinishReason, GenerateRequest, Shared, lock,
};
use crate::error::Error;
use crate::lora::{Adapter, load_adapter};
use crate::model::{KvCache, Model, SeqInput};
use crate::tokenizer::Tokenizer;

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
}

pub(super) struct Running {
    pub(super) request: GenerateRequest,
    adapter: Option<Arc<Adapter>>,
    pub(super) cache: KvCache,
    pub(super) generated: Vec<u32>,
    pub(super) emitted_bytes: usize,
    /// Bytes of the text already searched for stop strings (see `decode::advance`).
    pub(super) stop_scanned_bytes: usize,
    prefilled: bool,
    rng: ChaCha20Rng,
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
                stop_scanned_bytes: 0,
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
            let token = choose(&logits, r.request.sampling, &mut r.rng);
            self.stats.generated_tokens += 1;
            advance(r, token, &self.model, &self.tokenizer);
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
        match self.forward(&all) {
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
        *lock(&self.shared.stats) = self.stats.clone();
    }
}
