//! The engine: one [`Model`], the residency cache, the alias registry and the batch scheduler,
//! behind one handle ([`Engine`]). It is the only door to the cache and the registry: the HTTP
//! layer asks it to resolve, load and unload adapters and for its counters, and never locks
//! either itself.
//!
//! * `scheduler` — continuous batching on its own thread: requests arrive on a channel; each
//!   step admits waiting sequences whose adapter is resident (up to a batch size and a
//!   prefill-token budget), runs **one** forward over every running sequence — a new
//!   sequence's whole prompt, one token for the others — and drops finished sequences. An
//!   adapter that is not resident is loaded on a loader thread while the batch keeps running.
//! * `sample` — the next token (greedy, or a reproducible draw under OpenAI's parameters)
//!   and its log-probabilities.
//! * `decode` — the text streamed for a token (incremental detokenization, stop ids and
//!   stop strings held back until they cannot match).
//!
//! Conversation prefixes (SPEC §4): a request that carries its text ([`Conversation`]) and
//! continues a held prefix starts from that KV and prefills only the rest (bit-identical in
//! class D); its finished turn is offered to the residency cache, kept iff `γ·s > h`, and
//! reported in [`Engine::residency`].
//!
//! Failures reach a request as [`Event::Failed`] carrying the crate's [`Error`]; the HTTP layer
//! alone turns an error into a status.

pub(crate) mod decode;
pub mod sample;
mod scheduler;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::adapter_files::AdapterRoots;
use crate::cache::{CacheStats, ResidencyCache, ResidentInfo};
use crate::error::{Error, Result};
use crate::lora::{ADAPTER_CONFIG, AdapterLimits, load_adapter, read_adapter_id};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
pub use sample::{Sampling, TokenLogprobs};
use scheduler::{Command, Scheduler};

/// Which adapter a request uses, as the engine's registry resolved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterRef {
    /// Content id (SHA-256).
    pub id: String,
    /// The name it was asked for by (for metrics).
    pub alias: String,
    /// Where to load it from on a miss.
    pub dir: PathBuf,
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
    /// Send each token's [`Event::Text`] as it is chosen. `false` holds them until the
    /// sequence ends and sends them together before [`Event::Done`]: a caller that answers
    /// with the whole text (a non-streamed completion) is then woken once per request instead
    /// of once per token, which on a small machine takes a core from the decode loop.
    pub stream: bool,
    /// The request as text, for a chat-shaped prompt's KV to be found and held as a
    /// conversation prefix (SPEC §4); `None` holds and reuses nothing.
    pub conversation: Option<Conversation>,
}

/// What names a request's conversation prefixes ([`cx_protocol::prefix`]): the catalog model and
/// the prompt text the tokens were encoded from. With it, a prompt that continues a held prefix
/// (same model, same adapter) prefills only what follows it, and the finished turn is offered to
/// the cache as the next prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    /// The base model's catalog name (what the exchange names it by).
    pub model: String,
    /// The prompt text (`prompt` is its encoding).
    pub prompt_text: String,
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
#[derive(Clone, Debug)]
pub enum Event {
    /// New text (may be empty when a token completes nothing printable yet).
    Text {
        /// The new text.
        delta: String,
        /// The token just chosen.
        token: u32,
        /// Its log-probabilities, when the request asked for them.
        logprobs: Option<TokenLogprobs>,
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
    /// The request failed (adapter load, residency, forward, decoding, a stopped scheduler).
    /// Shared: one failed load fails every request waiting on that adapter.
    Failed(Arc<Error>),
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
    /// Prompt tokens not prefilled because a held conversation prefix already had them.
    pub prefix_reused_tokens: u64,
}

/// A registered adapter, as `/v1/models` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterListing {
    /// The name it answers to.
    pub alias: String,
    /// Content id.
    pub id: String,
    /// Whether it is in the residency cache now.
    pub resident: bool,
}

/// What [`Engine::load_adapter`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedAdapter {
    /// Content id.
    pub id: String,
    /// Rank `r`.
    pub rank: usize,
    /// Bytes held.
    pub bytes: u64,
    /// Pinned (rent on state).
    pub pinned: bool,
    /// Ids evicted to make room, in order.
    pub evicted: Vec<String>,
}

/// The engine's counters at one instant, for `/metrics`.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineMetrics {
    /// The scheduler's counters.
    pub stats: EngineStats,
    /// The cache's counters.
    pub cache: CacheStats,
    /// Resident adapters, highest value per byte first.
    pub resident: Vec<ResidentInfo>,
    /// The slot the shadow price is quoted for: the mean resident adapter (0 when none).
    pub slot_bytes: u64,
    /// Shadow price of room for `slot_bytes` (SPEC §4); `None` when no room can be made.
    pub slot_shadow_price: Option<f64>,
    /// Alias of each registered id (the last registered name wins).
    pub aliases: BTreeMap<String, String>,
}

/// State the scheduler thread and the handles share; only this module locks it.
#[derive(Debug)]
struct Shared {
    cache: Mutex<ResidencyCache>,
    /// Alias → adapter, loaded on first use.
    registry: Mutex<BTreeMap<String, AdapterRef>>,
    /// Where adapters may be loaded from.
    roots: Mutex<AdapterRoots>,
    stats: Mutex<EngineStats>,
    start: Instant,
    /// Rung when what the cache holds changes in a way an offer reports (a prefix kept, taken
    /// or evicted), so the exchange hears it now.
    residency_changed: Arc<tokio::sync::Notify>,
}

/// A lock whose holder panicked still guards consistent data here: every update is a short
/// sequence of assignments that cannot panic halfway in practice.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Seconds since the engine started (the cache's clock).
    fn now_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
    fn cache(&self) -> MutexGuard<'_, ResidencyCache> {
        lock(&self.cache)
    }
    fn registry(&self) -> MutexGuard<'_, BTreeMap<String, AdapterRef>> {
        lock(&self.registry)
    }
}

/// Whether `name` has the form of a content id (64 hex digits, as [`cx_protocol::content_id`]
/// writes them).
fn looks_like_id(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// An id names exactly the bytes it hashes, and an alias keeps naming the bytes it was given:
/// `name` may register adapter `id` only if it is not some other content's id and does not
/// already name other bytes. Without this a request for id X could run adapter Y.
fn check_name(registry: &BTreeMap<String, AdapterRef>, name: &str, id: &str) -> Result<()> {
    if looks_like_id(name) && !name.eq_ignore_ascii_case(id) {
        return Err(Error::AdapterConflict(format!(
            "lora_name `{name}` has the form of a content id, but these files' id is `{id}`: \
             an id names only its own bytes; pick another name"
        )));
    }
    if let Some(existing) = registry.get(name)
        && existing.id != id
    {
        return Err(Error::AdapterConflict(format!(
            "lora_name `{name}` already names adapter `{}`; unload it first or pick another name",
            existing.id
        )));
    }
    Ok(())
}

/// Handle to the engine (cheap to clone).
#[derive(Clone, Debug)]
pub struct Engine {
    tx: std::sync::mpsc::Sender<Command>,
    shared: Arc<Shared>,
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    config: EngineConfig,
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
            registry: Mutex::new(BTreeMap::new()),
            roots: Mutex::new(AdapterRoots::default()),
            stats: Mutex::new(EngineStats::default()),
            start: Instant::now(),
            residency_changed: Arc::new(tokio::sync::Notify::new()),
        });
        let scheduler = Scheduler::new(
            model.clone(),
            tokenizer.clone(),
            shared.clone(),
            config,
            tx.clone(),
            Arc::downgrade(&alive),
        );
        std::thread::Builder::new()
            .name("cx-scheduler".into())
            .spawn(move || scheduler.run(rx))
            .expect("spawning the scheduler thread");
        Self {
            tx,
            shared,
            model,
            tokenizer,
            config,
            _alive: alive,
        }
    }

    /// Queues a request; events arrive on its channel.
    pub fn submit(&self, request: GenerateRequest) {
        if let Err(std::sync::mpsc::SendError(Command::Generate(request))) =
            self.tx.send(Command::Generate(request))
        {
            let _ = request
                .events
                .send(Event::Failed(Arc::new(Error::SchedulerStopped)));
        }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Lets adapters be loaded by path from `dirs` (and their sub-directories), besides the
    /// roots already allowed.
    pub fn add_adapter_roots(&self, dirs: &[PathBuf]) -> Result<()> {
        let added = AdapterRoots::new(dirs)?;
        lock(&self.shared.roots).extend(added);
        Ok(())
    }

    fn limits(&self) -> AdapterLimits {
        AdapterLimits::new(self.model.config(), self.config.max_rank)
    }

    /// Registers every sub-directory of `dir` holding an `adapter_config.json` under its
    /// folder name (loaded on first use), and makes `dir` an adapter root. Returns the aliases.
    pub fn register_dir(&self, dir: &Path) -> Result<Vec<String>> {
        self.add_adapter_roots(&[dir.to_path_buf()])?;
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join(ADAPTER_CONFIG).exists())
            .collect();
        entries.sort();
        let mut aliases = Vec::new();
        for path in entries {
            let alias = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.register(&alias, &path)?;
            aliases.push(alias);
        }
        Ok(aliases)
    }

    /// Registers one adapter directory (inside a root) under `alias`, hashing its files for the
    /// id; the weights are loaded on first use. Refused when `alias` would shadow an id or
    /// rename other bytes ([`Error::AdapterConflict`]).
    pub fn register(&self, alias: &str, dir: &Path) -> Result<AdapterRef> {
        let dir = lock(&self.shared.roots).resolve(dir)?;
        let adapter = AdapterRef {
            id: read_adapter_id(&dir, self.limits())?,
            alias: alias.to_string(),
            dir,
        };
        let mut registry = self.shared.registry();
        check_name(&registry, alias, &adapter.id)?;
        registry.insert(alias.to_string(), adapter.clone());
        Ok(adapter)
    }

    /// The adapter registered as `name`, an alias or an id.
    pub fn resolve(&self, name: &str) -> Result<AdapterRef> {
        let registry = self.shared.registry();
        registry
            .get(name)
            .or_else(|| registry.values().find(|a| a.id == name))
            .cloned()
            .ok_or_else(|| Error::UnknownAdapter(name.to_string()))
    }

    /// Loads the PEFT adapter in `dir` (which must lie inside an adapter root) now: parse,
    /// check against the base, make resident (pinned if `pin`), register as `name`. Blocking:
    /// file reads and checks; call it off async workers. Nothing is registered or resident on
    /// error. Loading the same bytes under the same name again is a no-op that succeeds; a name
    /// that is another adapter's id, or already names other bytes, is refused.
    pub fn load_adapter(&self, name: &str, dir: &Path, pin: bool) -> Result<LoadedAdapter> {
        let dir = lock(&self.shared.roots).resolve(dir)?;
        let t = Instant::now();
        let adapter = Arc::new(load_adapter(
            &dir,
            self.model.config(),
            self.config.max_rank,
        )?);
        let took = t.elapsed();
        // One lock over the check and both inserts: two loads of one name cannot interleave.
        let mut registry = self.shared.registry();
        check_name(&registry, name, adapter.id())?;
        let evicted = {
            let mut cache = self.shared.cache();
            cache.record_load_time(adapter.bytes(), took.as_secs_f64());
            cache.insert(adapter.clone(), pin, self.shared.now_s())?
        };
        registry.insert(
            name.to_string(),
            AdapterRef {
                id: adapter.id().to_string(),
                alias: name.to_string(),
                dir,
            },
        );
        Ok(LoadedAdapter {
            id: adapter.id().to_string(),
            rank: adapter.rank(),
            bytes: adapter.bytes(),
            pinned: pin,
            evicted,
        })
    }

    /// Pins (or unpins) resident adapter `id`: a pinned adapter is never evicted (a rent the
    /// exchange committed to this provider keeps it loaded). False when it is not resident.
    pub fn set_pinned(&self, id: &str, pinned: bool) -> bool {
        self.shared.cache().set_pinned(id, pinned)
    }

    /// Forgets the alias `name`; the adapter leaves the cache when no other alias names it
    /// (running sequences keep their copy until they finish).
    pub fn unload_adapter(&self, name: &str) -> Result<()> {
        let removed = self.shared.registry().remove(name);
        let Some(adapter) = removed else {
            return Err(Error::UnknownAdapter(name.to_string()));
        };
        let still_named = self.shared.registry().values().any(|a| a.id == adapter.id);
        if !still_named {
            self.shared.cache().remove(&adapter.id);
        }
        Ok(())
    }

    /// Holds `bytes` of the residency budget for `key` (a training client's state: it is
    /// resident state too), evicting adapters to make room; [`Error::CacheFull`] when the rest
    /// is pinned or in use. Returns the evicted ids.
    pub fn reserve_bytes(&self, key: &str, bytes: u64) -> Result<Vec<String>> {
        let now = self.shared.now_s();
        self.shared.cache().reserve(key, bytes, now)
    }

    /// Frees what [`reserve_bytes`](Self::reserve_bytes) held for `key`.
    pub fn release_bytes(&self, key: &str) {
        self.shared.cache().release_reservation(key);
    }

    /// Notified whenever the held prefixes change (kept, taken, evicted): what an offer's
    /// residency report must then say again.
    pub fn residency_changed(&self) -> Arc<tokio::sync::Notify> {
        self.shared.residency_changed.clone()
    }

    /// Whether the conversation prefix `id` is held now.
    pub fn holds_prefix(&self, id: &str) -> bool {
        self.shared.cache().holds_prefix(id)
    }

    /// Pins (or unpins) held prefix `id`: never evicted, and continuations take copies (a rent
    /// on it). False when it is not held.
    pub fn set_prefix_pinned(&self, id: &str, pinned: bool) -> bool {
        self.shared.cache().set_prefix_pinned(id, pinned)
    }

    /// The largest LoRA rank this engine accepts.
    pub fn max_rank(&self) -> usize {
        self.config.max_rank
    }

    /// What the cache holds now, as the offer reports it (SPEC §4): the pinned adapters, the
    /// free bytes of the budget, the shadow price of a slot the size of the median resident
    /// adapter, and the held conversation prefixes (most valuable first, bounded).
    pub fn residency(&self) -> cx_protocol::offer::Residency {
        let now = self.shared.now_s();
        let cache = self.shared.cache();
        let resident = cache.resident(now);
        let mut sizes: Vec<u64> = resident.iter().map(|r| r.bytes).collect();
        sizes.sort_unstable();
        let slot_bytes = sizes.get(sizes.len() / 2).copied().unwrap_or(0);
        let prefixes = cache.held_prefixes(cx_protocol::prefix::MAX_REPORTED_PREFIXES);
        let prefix_bytes = prefixes
            .iter()
            .map(|id| cache.prefix_bytes(id).unwrap_or(0))
            .collect();
        cx_protocol::offer::Residency {
            pinned_adapters: resident
                .iter()
                .filter(|r| r.pinned)
                .map(|r| r.id.clone())
                .collect(),
            free_bytes: cache.free_bytes(),
            slot_bytes,
            slot_shadow_price: cache.shadow_price(slot_bytes, now),
            prefixes,
            prefix_bytes,
            // The exchange link names the base it serves (it knows the checkpoint's id).
            bases: Vec::new(),
        }
    }

    /// Registered adapters in alias order, and whether each is resident.
    pub fn adapters(&self) -> Vec<AdapterListing> {
        let registered: Vec<AdapterRef> = self.shared.registry().values().cloned().collect();
        let cache = self.shared.cache();
        registered
            .into_iter()
            .map(|a| AdapterListing {
                resident: cache.contains(&a.id),
                alias: a.alias,
                id: a.id,
            })
            .collect()
    }

    /// The scheduler's and the cache's counters now.
    pub fn metrics(&self) -> EngineMetrics {
        let stats = lock(&self.shared.stats).clone();
        let aliases = self
            .shared
            .registry()
            .values()
            .map(|a| (a.id.clone(), a.alias.clone()))
            .collect();
        let now = self.shared.now_s();
        let cache = self.shared.cache();
        let resident = cache.resident(now);
        let slot_bytes = if resident.is_empty() {
            0
        } else {
            resident.iter().map(|r| r.bytes).sum::<u64>() / resident.len() as u64
        };
        EngineMetrics {
            stats,
            cache: cache.stats(),
            slot_shadow_price: cache.shadow_price(slot_bytes, now),
            slot_bytes,
            resident,
            aliases,
        }
    }
}
