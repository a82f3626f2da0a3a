//! The bases a provider holds, and the ones it can load when a job needs them (SPEC §2's β = 0
//! made real): each held base is an [`Engine`] of its own (its model, adapter cache and
//! scheduler); a job for a base not held loads it from the provider's store within the memory
//! budget for bases, evicting the held bases of least value per byte first.
//!
//! * The **primary** base (`serve --model`) is loaded at start and never evicted: the
//!   provider's own HTTP door, training and the matmul kernel run on it.
//! * The **store** is a set of checkpoint folders the operator names (`--base-store
//!   NAME=DIR`), each known by its content id ([`checkpoint_id`], computed once at start) and
//!   the catalog name the exchange trades it under.
//! * **Value per byte** of a held base: its recent uses (an exponentially decayed count, time
//!   constant [`USE_WINDOW_S`]) times the seconds its load took, over its bytes — the loading a
//!   later job is spared per byte kept, the rule the adapter cache uses. A base pinned by a rent
//!   or serving a job now is never evicted: a load that needs a busy base's room waits for its
//!   jobs to end (as long as its caller allows), and when no room can be made the load is
//!   refused by name and nothing is evicted.
//! * **Measured load rate**: every load (the primary's at start included) is timed; the offer
//!   states bytes loaded over seconds taken as `base_load_bps`, which the exchange's t̂ counts a
//!   fetch at.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cx_kernels::CpuConfig;

use crate::cache::{CacheConfig, EvictionPolicy, ResidencyCache};
use crate::engine::{Engine, EngineConfig};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::model::content::checkpoint_id;
use crate::tokenizer::Tokenizer;

/// Time constant of a base's use count, seconds.
pub const USE_WINDOW_S: f64 = 600.0;

/// A checkpoint the provider can load: where it is, what it is, what it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseSource {
    /// The catalog name the exchange trades it under.
    pub name: String,
    /// Its folder (a Hugging Face checkpoint).
    pub dir: PathBuf,
    /// Its content id.
    pub id: String,
    /// Bytes its weights take in memory (their files' tensor data: weights are held at their
    /// dtype).
    pub bytes: u64,
}

impl BaseSource {
    /// Reads `dir`'s id and size (hashing its files once).
    pub fn open(name: &str, dir: &Path) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::Model(format!(
                "{}: a stored base needs a catalog name (NAME=DIR)",
                dir.display()
            )));
        }
        // What the model loader would refuse (no config.json, an architecture or field it does
        // not implement) is refused now, not on the first job for it.
        crate::model::read_config(dir)?;
        let mut bytes = 0;
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            if entry
                .file_name()
                .to_string_lossy()
                .ends_with(".safetensors")
            {
                bytes += tensor_bytes(&entry.path())?;
            }
        }
        Ok(Self {
            name: name.to_owned(),
            dir: dir.to_owned(),
            id: checkpoint_id(dir)?,
            bytes,
        })
    }
}

/// The tensor data of a safetensors file: its size less the 8-byte length and the JSON header
/// that length gives (what loading it holds, weights being kept at their dtype).
fn tensor_bytes(path: &Path) -> Result<u64> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut header = [0u8; 8];
    std::io::Read::read_exact(&mut file, &mut header).map_err(|e| Error::io(path, e))?;
    len.checked_sub(8)
        .and_then(|rest| rest.checked_sub(u64::from_le_bytes(header)))
        .ok_or_else(|| Error::Safetensors {
            path: path.to_owned(),
            reason: format!("its header claims more than the file's {len} bytes"),
        })
}

/// How a base loaded from the store is served: as the primary is.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The CPU kernels' threads and mode.
    pub cpu: CpuConfig,
    /// The device SGMV runs on (`None`: the CPU).
    pub device: Option<cx_kernels::Device>,
    /// Each base's adapter cache budget, bytes (adapters are per base: one cache each).
    pub cache_bytes: u64,
    /// Each adapter cache's eviction rule.
    pub eviction: EvictionPolicy,
    /// The scheduler's limits.
    pub engine: EngineConfig,
    /// Where adapters may be loaded from (the fetched-adapters folder among them).
    pub adapter_roots: Vec<PathBuf>,
    /// Quantize weight matrices to this block format as they load (`--quantize`).
    pub quantize: Option<cx_kernels::QuantType>,
}

/// A base in memory.
#[derive(Debug)]
struct Held {
    source: BaseSource,
    engine: Engine,
    /// Loaded at start, never evicted.
    primary: bool,
    /// A rent pins it.
    pinned: bool,
    /// Seconds its load took.
    load_s: f64,
    /// Decayed use count, as of `used_at`.
    uses: f64,
    used_at: Instant,
    /// Held by every job it serves: more than one strong count means it is busy.
    lease: Arc<()>,
}

/// A job's hold on a base: when the job lets go, the loads waiting for room hear it.
#[derive(Debug)]
struct Guard {
    token: Option<Arc<()>>,
    released: Arc<tokio::sync::Notify>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The count falls before the waiters look again.
        self.token.take();
        self.released.notify_waiters();
    }
}

impl Held {
    fn uses_at(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.used_at).as_secs_f64();
        self.uses * (-dt / USE_WINDOW_S).exp()
    }

    /// Loading seconds saved per byte kept, over the use window.
    fn value_per_byte(&self, now: Instant) -> f64 {
        self.uses_at(now) * self.load_s / self.source.bytes.max(1) as f64
    }

    fn evictable(&self) -> bool {
        !self.busy() && !self.primary && !self.pinned
    }

    fn busy(&self) -> bool {
        Arc::strong_count(&self.lease) > 1
    }
}

#[derive(Debug, Default)]
struct State {
    held: Vec<Held>,
    /// Bytes and seconds of every load so far (the measured rate).
    loaded_bytes: u64,
    load_s: f64,
    loads: u64,
    evictions: u64,
    /// Stored bases whose load failed: no longer offered (the operator fixes the folder and
    /// restarts), so the exchange stops sending jobs that would fail the same way.
    withdrawn: Vec<String>,
}

/// Why no room can be made now.
enum Room {
    /// Bases serving jobs hold it: there will be room when they are done.
    Busy(Error),
    /// The bases that stay (served, pinned) leave too little.
    Never(Error),
}

/// A base ready to serve one job: its engine, and a lease that keeps it from eviction while
/// the job holds it.
#[derive(Debug)]
pub struct BaseLease {
    /// The base's engine.
    pub engine: Engine,
    /// What it is.
    pub source: BaseSource,
    _guard: Guard,
}

/// What one load did.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseLoad {
    /// Seconds it took.
    pub seconds: f64,
    /// Bytes it holds.
    pub bytes: u64,
    /// Content ids evicted to make room, in order.
    pub evicted: Vec<String>,
}

/// The provider's bases: the one door to them.
#[derive(Debug)]
pub struct Bases {
    primary: Engine,
    store: Vec<BaseSource>,
    budget_bytes: u64,
    options: ServeOptions,
    state: Mutex<State>,
    /// One load at a time: two jobs for one base load it once, and two loads never count the
    /// same free bytes.
    loading: tokio::sync::Mutex<()>,
    /// Rung when a job lets go of a base (a waiting load may find its room).
    released: Arc<tokio::sync::Notify>,
}

impl Bases {
    /// The primary base (loaded in `load_s` seconds), the store and the budget all bases share.
    /// The budget must hold the primary; a store entry larger than what is left beside it is
    /// refused by name (it could never be loaded).
    pub fn new(
        primary: (BaseSource, Engine, f64),
        store: Vec<BaseSource>,
        budget_bytes: u64,
        options: ServeOptions,
    ) -> Result<Self> {
        let (source, engine, load_s) = primary;
        let source = BaseSource {
            bytes: engine.model().weight_bytes() as u64,
            ..source
        };
        if source.bytes > budget_bytes {
            return Err(Error::Model(format!(
                "the base memory budget ({budget_bytes} B) is smaller than the served model \
                 `{}` ({} B)",
                source.name, source.bytes
            )));
        }
        let room = budget_bytes - source.bytes;
        for s in &store {
            if s.bytes > room {
                return Err(Error::Model(format!(
                    "stored base `{}` ({} B) does not fit beside the served model in the base \
                     memory budget ({room} B left of {budget_bytes} B)",
                    s.name, s.bytes
                )));
            }
            if s.name == source.name && s.id != source.id {
                return Err(Error::Model(format!(
                    "stored base `{}` has other weights than the served model of that name",
                    s.name
                )));
            }
        }
        let released = Arc::new(tokio::sync::Notify::new());
        let state = State {
            loaded_bytes: source.bytes,
            load_s,
            loads: 1,
            held: vec![Held {
                source,
                engine: engine.clone(),
                primary: true,
                pinned: false,
                load_s,
                uses: 0.0,
                used_at: Instant::now(),
                lease: Arc::new(()),
            }],
            evictions: 0,
            withdrawn: Vec::new(),
        };
        Ok(Self {
            primary: engine,
            store,
            budget_bytes,
            options,
            state: Mutex::new(state),
            loading: tokio::sync::Mutex::new(()),
            released,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn guard(&self, lease: &Arc<()>) -> Guard {
        Guard {
            token: Some(lease.clone()),
            released: self.released.clone(),
        }
    }

    /// The primary base's engine.
    pub fn primary(&self) -> &Engine {
        &self.primary
    }

    /// The base named `name` if held now (a use is counted).
    fn held(&self, name: &str) -> Option<BaseLease> {
        let now = Instant::now();
        let mut state = self.state();
        let held = state.held.iter_mut().find(|h| h.source.name == name)?;
        held.uses = held.uses_at(now) + 1.0;
        held.used_at = now;
        Some(BaseLease {
            engine: held.engine.clone(),
            source: held.source.clone(),
            _guard: self.guard(&held.lease),
        })
    }

    /// The base named `name`: held, or loaded from the store now (evicting by value per byte;
    /// if the room is held by bases serving jobs, waiting up to `wait` for them to end). The
    /// second item says what the load did, when there was one.
    pub async fn lease(&self, name: &str, wait: Duration) -> Result<(BaseLease, Option<BaseLoad>)> {
        if let Some(lease) = self.held(name) {
            return Ok((lease, None));
        }
        let _one_at_a_time = self.loading.lock().await;
        if let Some(lease) = self.held(name) {
            return Ok((lease, None));
        }
        let source = self
            .store
            .iter()
            .find(|s| s.name == name)
            .cloned()
            .ok_or_else(|| {
                Error::Model(format!(
                    "this provider neither holds nor stores a base named `{name}`"
                ))
            })?;
        if self.state().withdrawn.contains(&source.name) {
            return Err(Error::Model(format!(
                "stored base `{name}` failed to load earlier and is no longer offered"
            )));
        }
        let give_up = tokio::time::Instant::now() + wait;
        let evicted = loop {
            // Registered before the check, so a release between the two is not missed.
            let released = self.released.notified();
            match self.make_room(&source) {
                Ok(evicted) => break evicted,
                Err(Room::Busy(e)) if tokio::time::Instant::now() < give_up => {
                    tracing::info!("{e}: waiting for its jobs to end");
                    let _ = tokio::time::timeout_at(give_up, released).await;
                }
                Err(Room::Busy(e) | Room::Never(e)) => return Err(e),
            }
        };
        let options = self.options.clone();
        let dir = source.dir.clone();
        let started = Instant::now();
        let loaded = tokio::task::spawn_blocking(move || start_engine(&dir, &options))
            .await
            .unwrap_or(Err(Error::LoadPanicked));
        let engine = match loaded {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!(
                    "base `{}`: loading {} failed, no longer offered: {e}",
                    source.name,
                    source.dir.display()
                );
                self.state().withdrawn.push(source.name.clone());
                return Err(e);
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        let bytes = engine.model().weight_bytes() as u64;
        let mut state = self.state();
        state.loaded_bytes += bytes;
        state.load_s += seconds;
        state.loads += 1;
        let lease = Arc::new(());
        let source = BaseSource { bytes, ..source };
        state.held.push(Held {
            source: source.clone(),
            engine: engine.clone(),
            primary: false,
            pinned: false,
            load_s: seconds,
            uses: 1.0,
            used_at: Instant::now(),
            lease: lease.clone(),
        });
        drop(state);
        // `cx bench market` counts these lines (`loaded in N ms`).
        tracing::info!(
            "base `{}` ({}): loaded in {} ms from {} ({bytes} B), evicted {:?}",
            source.name,
            source.id,
            (seconds * 1e3).round(),
            source.dir.display(),
            evicted
        );
        Ok((
            BaseLease {
                engine,
                source,
                _guard: self.guard(&lease),
            },
            Some(BaseLoad {
                seconds,
                bytes,
                evicted,
            }),
        ))
    }

    /// Evicts held bases, least value per byte first, until `source` fits, and returns their
    /// ids — before the load, so the budget holds at its peak too (a load that then fails has
    /// lost them; they load again when wanted). Chosen and evicted under one lock, so none is
    /// leased between. Refused by name, evicting nothing, when the bases that cannot go (the
    /// primary, pinned, serving) leave too little — [`Room::Busy`] when it would fit once the
    /// busy ones are done.
    fn make_room(&self, source: &BaseSource) -> std::result::Result<Vec<String>, Room> {
        let now = Instant::now();
        let mut state = self.state();
        let used: u64 = state.held.iter().map(|h| h.source.bytes).sum();
        let mut free = self.budget_bytes.saturating_sub(used);
        let mut candidates: Vec<&Held> = state.held.iter().filter(|h| h.evictable()).collect();
        candidates.sort_by(|a, b| {
            a.value_per_byte(now)
                .total_cmp(&b.value_per_byte(now))
                .then(a.used_at.cmp(&b.used_at))
        });
        let mut victims = Vec::new();
        for h in candidates {
            if free >= source.bytes {
                break;
            }
            free += h.source.bytes;
            victims.push(h.source.id.clone());
        }
        if free < source.bytes {
            let busy: u64 = state
                .held
                .iter()
                .filter(|h| h.busy() && !h.primary && !h.pinned)
                .map(|h| h.source.bytes)
                .sum();
            let kept: Vec<String> = state
                .held
                .iter()
                .filter(|h| !h.evictable())
                .map(|h| {
                    let why = if h.primary {
                        "served"
                    } else if h.pinned {
                        "pinned by a rent"
                    } else {
                        "serving a job"
                    };
                    format!("`{}` ({why})", h.source.name)
                })
                .collect();
            let e = Error::Model(format!(
                "no room for base `{}` ({} B): the budget is {} B and {} cannot be evicted",
                source.name,
                source.bytes,
                self.budget_bytes,
                kept.join(", ")
            ));
            return Err(if free + busy >= source.bytes {
                Room::Busy(e)
            } else {
                Room::Never(e)
            });
        }
        state.held.retain(|h| !victims.contains(&h.source.id));
        state.evictions += victims.len() as u64;
        Ok(victims)
    }

    /// Pins exactly the held bases whose content ids are in `ids` (a rent's term), unpinning
    /// the rest. Returns whether anything changed.
    pub fn set_pins(&self, ids: &std::collections::HashSet<String>) -> bool {
        let mut changed = false;
        for h in &mut self.state().held {
            let pinned = ids.contains(&h.source.id);
            changed |= h.pinned != pinned;
            h.pinned = pinned;
        }
        changed
    }

    /// Whether base `id` is held now.
    pub fn holds(&self, id: &str) -> bool {
        self.state().held.iter().any(|h| h.source.id == id)
    }

    /// The held bases as the offer reports them.
    pub fn resident(&self) -> Vec<cx_protocol::offer::ResidentBase> {
        self.state()
            .held
            .iter()
            .map(|h| cx_protocol::offer::ResidentBase {
                id: h.source.id.clone(),
                name: h.source.name.clone(),
                bytes: h.source.bytes,
                pinned: h.pinned,
            })
            .collect()
    }

    /// Every held base's engine (to list and report their adapters and prefixes).
    pub fn engines(&self) -> Vec<Engine> {
        self.state().held.iter().map(|h| h.engine.clone()).collect()
    }

    /// Bytes the bases that cannot be evicted leave for loads: the most a fetch can take.
    pub fn room_bytes(&self) -> u64 {
        let fixed: u64 = self
            .state()
            .held
            .iter()
            .filter(|h| h.primary || h.pinned)
            .map(|h| h.source.bytes)
            .sum();
        self.budget_bytes.saturating_sub(fixed)
    }

    /// The stored bases not held that fit in [`Bases::room_bytes`] (and have not failed to
    /// load): what the offer says this provider can load.
    pub fn fetchable(&self) -> Vec<String> {
        let room = self.room_bytes();
        let state = self.state();
        self.store
            .iter()
            .filter(|s| {
                s.bytes <= room
                    && !state.held.iter().any(|h| h.source.id == s.id)
                    && !state.withdrawn.contains(&s.name)
            })
            .map(|s| s.name.clone())
            .collect()
    }

    /// Bits per second over every load so far (the primary's at start included).
    pub fn load_bps(&self) -> f64 {
        let state = self.state();
        state.loaded_bytes as f64 * 8.0 / state.load_s.max(1e-6)
    }

    /// Loads and evictions so far (the primary's load counted).
    pub fn counts(&self) -> (u64, u64) {
        let state = self.state();
        (state.loads, state.evictions)
    }
}

/// Loads the checkpoint in `dir` and starts its engine, served as `options` say.
pub fn start_engine(dir: &Path, options: &ServeOptions) -> Result<Engine> {
    let mut model = Model::load_quantized(dir, options.cpu, options.quantize)?;
    if let Some(device) = &options.device {
        model.set_device(device.clone());
    }
    let tokenizer = Tokenizer::for_model(dir, model.config())?;
    let engine = Engine::start(
        Arc::new(model),
        Arc::new(tokenizer),
        ResidencyCache::new(CacheConfig::new(options.cache_bytes, options.eviction)),
        options.engine,
    );
    engine.add_adapter_roots(&options.adapter_roots)?;
    Ok(engine)
}
