//! [`Trainer`]: the training clients of one engine, the one door to them. Creating a client
//! reserves its state in the engine's residency budget; each `forward_backward` reserves its
//! activations while it runs; a save writes PEFT files and loads them through the serving path
//! ([`Engine::load_adapter`]); sampling decodes through the serving forward.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use candle_core::DType;
use serde::Serialize;

use super::client::{
    TrainingClient, activation_bytes, check_tokens, prepare, state_bytes, write_adapter_dir,
};
use super::forward::Base;
use super::{AdamWParams, ForwardBackward, LoraSpec, LossEntry, OptimStep, Precision};
use crate::engine::{Engine, Sampling};
use crate::error::{Error, Result};
use crate::lora::{Adapter, adapter_id};
use crate::model::{KvCache, Model, SeqInput};

/// How the [`Trainer`] is limited.
#[derive(Clone, Debug)]
pub struct TrainingOptions {
    /// Where saved adapters are written (one folder per content id); an adapter root.
    pub dir: PathBuf,
    /// Training clients at most at once.
    pub max_clients: usize,
    /// Padded positions (`sequences × longest`) one `forward_backward` may hold.
    pub max_tokens_per_call: usize,
}

impl TrainingOptions {
    /// Defaults under `dir`: 8 clients, 8192 positions per call.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            max_clients: 8,
            max_tokens_per_call: 8192,
        }
    }
}

/// What a client looks like from outside (`GET /v1/training/clients/{id}`).
#[derive(Clone, Debug, Serialize)]
pub struct ClientInfo {
    /// The client's id.
    pub id: String,
    /// The base it trains on.
    pub base_model: String,
    /// Its LoRA configuration.
    pub config: ClientConfig,
    /// Optimizer steps taken.
    pub step: u64,
    /// `forward_backward` calls waiting for `optim_step`.
    pub accumulated: usize,
    /// Tokens passed through `forward_backward`.
    pub tokens_seen: u64,
    /// Trainable scalars.
    pub parameters: u64,
    /// Bytes held in the residency budget (parameters, gradients, AdamW moments).
    pub bytes: u64,
    /// Unix seconds at creation.
    pub created: u64,
    /// The adapters saved from it, oldest first.
    pub saved: Vec<String>,
    /// Losses, oldest first (only in the single-client view).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_history: Option<Vec<LossEntry>>,
}

/// A client's LoRA configuration as the API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ClientConfig {
    /// Rank.
    pub rank: usize,
    /// Alpha.
    pub lora_alpha: f64,
    /// PEFT module names.
    pub target_modules: Vec<&'static str>,
    /// rsLoRA.
    pub use_rslora: bool,
    /// Seed of `A`.
    pub seed: u64,
    /// The scale `s`.
    pub scale: f64,
}

/// What a save did.
#[derive(Clone, Debug, Serialize)]
pub struct Saved {
    /// Content id of the two files.
    pub id: String,
    /// The name it is registered under (the id unless a name was given).
    pub name: String,
    /// Its folder.
    pub path: PathBuf,
    /// The optimizer step saved.
    pub step: u64,
    /// Rank.
    pub rank: usize,
    /// Bytes it holds in the cache.
    pub bytes: u64,
    /// Pinned.
    pub pinned: bool,
    /// Ids evicted to make room.
    pub evicted: Vec<String>,
}

/// What a sample produced.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// The new tokens (EOS excluded).
    pub tokens: Vec<u32>,
    /// Their text.
    pub text: String,
    /// `stop` (EOS or a stop string) or `length`.
    pub finish_reason: crate::engine::FinishReason,
}

/// A sampling request on a client (the serving path's options).
#[derive(Clone, Debug)]
pub struct SampleRequest {
    /// Prompt token ids (non-empty, in the vocabulary).
    pub prompt: Vec<u32>,
    /// New tokens at most (≥ 1; prompt + max_tokens within the context).
    pub max_tokens: usize,
    /// Greedy at 0, else seeded sampling.
    pub sampling: Sampling,
    /// Stop strings (generation ends before the first one).
    pub stop: Vec<String>,
}

struct Entry {
    client: TrainingClient,
    created: u64,
    saved: Vec<String>,
}

/// The training clients of one engine: the one door to them (the HTTP layer asks it).
pub struct Trainer {
    engine: Engine,
    model_name: String,
    /// The training forward's copy of the base, built when the first client is created: a
    /// provider that never trains does not hold it (the candle graph computes in f32, so a
    /// bf16 or quantized base is widened for it: 538 MB beside SmolLM2-135M's 269 MB in bf16).
    base: std::sync::OnceLock<Arc<Base>>,
    options: TrainingOptions,
    clients: Mutex<BTreeMap<String, Arc<Mutex<Entry>>>>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model_name", &self.model_name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A lock whose holder panicked still guards consistent data: a client is only changed by
/// assignments after every fallible computation has succeeded.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn reservation_key(id: &str) -> String {
    format!("training:{id}")
}

fn activation_key(id: &str) -> String {
    format!("training:{id}:activations")
}

impl Trainer {
    /// A trainer over `engine`'s model (the base answers to `model_name`); `options.dir` is
    /// created and made an adapter root so saved adapters load through the serving path.
    pub fn new(engine: Engine, model_name: String, options: TrainingOptions) -> Result<Self> {
        std::fs::create_dir_all(&options.dir).map_err(|e| Error::io(&options.dir, e))?;
        engine.add_adapter_roots(std::slice::from_ref(&options.dir))?;
        Ok(Self {
            engine,
            model_name,
            base: std::sync::OnceLock::new(),
            options,
            clients: Mutex::new(BTreeMap::new()),
        })
    }

    /// The training forward's base, built on first use (under the clients' lock, so once).
    fn base(&self) -> Result<Arc<Base>> {
        if let Some(base) = self.base.get() {
            return Ok(base.clone());
        }
        let model = self.engine.model();
        let base = Arc::new(Base::new(
            model.config(),
            &model.frozen_weights()?,
            DType::F32,
        )?);
        Ok(self.base.get_or_init(|| base).clone())
    }

    /// The limits.
    pub fn options(&self) -> &TrainingOptions {
        &self.options
    }

    /// The name of the base it trains on.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    fn entry(&self, id: &str) -> Result<Arc<Mutex<Entry>>> {
        lock(&self.clients)
            .get(id)
            .cloned()
            .ok_or_else(|| Error::UnknownTrainingClient(id.to_string()))
    }

    /// A new client; its state is reserved in the residency budget first (adapters may be
    /// evicted for it; [`Error::CacheFull`] when they cannot).
    pub fn create(&self, spec: &LoraSpec) -> Result<ClientInfo> {
        if let Some((field, message)) = spec.check(self.engine.max_rank()) {
            return Err(Error::TrainingInput {
                field: Some(field),
                message,
            });
        }
        let mut id_bytes = [0u8; 8];
        getrandom::fill(&mut id_bytes).expect("the operating system's random source");
        let id = format!("tc-{}", hex::encode(id_bytes));
        let config = self.engine.model().config().clone();
        let parameters: u64 = spec
            .target_modules
            .iter()
            .map(|&p| {
                let (d_in, d_out) = config.projection_shape(p);
                (spec.rank * (d_in + d_out)) as u64
            })
            .sum::<u64>()
            * config.num_hidden_layers as u64;
        let bytes = state_bytes(parameters, Precision::F32);
        // The count is checked and the client inserted under one lock: two creates cannot
        // both take the last slot.
        let mut clients = lock(&self.clients);
        if clients.len() >= self.options.max_clients {
            return Err(Error::TrainingLimit(format!(
                "{} training clients exist, the limit (--max-training-clients); delete one first",
                clients.len()
            )));
        }
        self.engine.reserve_bytes(&reservation_key(&id), bytes)?;
        let client = match self
            .base()
            .and_then(|base| TrainingClient::on_base(base, config, spec, Precision::F32))
        {
            Ok(client) => client,
            Err(e) => {
                self.engine.release_bytes(&reservation_key(&id));
                return Err(e);
            }
        };
        let entry = Entry {
            client,
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            saved: Vec::new(),
        };
        let info = self.info(&id, &entry, false);
        clients.insert(id, Arc::new(Mutex::new(entry)));
        Ok(info)
    }

    fn info(&self, id: &str, entry: &Entry, history: bool) -> ClientInfo {
        let c = &entry.client;
        let spec = c.spec();
        ClientInfo {
            id: id.to_string(),
            base_model: self.model_name.clone(),
            config: ClientConfig {
                rank: spec.rank,
                lora_alpha: spec.lora_alpha,
                target_modules: spec.target_modules.iter().map(|p| p.name()).collect(),
                use_rslora: spec.use_rslora,
                seed: spec.seed,
                scale: spec.scale(),
            },
            step: c.step(),
            accumulated: c.accumulated(),
            tokens_seen: c.tokens_seen(),
            parameters: c.parameter_count(),
            bytes: c.state_bytes(),
            created: entry.created,
            saved: entry.saved.clone(),
            loss_history: history.then(|| c.loss_history().copied().collect()),
        }
    }

    /// Every client, by id (without loss histories).
    pub fn list(&self) -> Vec<ClientInfo> {
        let entries: Vec<(String, Arc<Mutex<Entry>>)> = lock(&self.clients)
            .iter()
            .map(|(id, e)| (id.clone(), e.clone()))
            .collect();
        entries
            .iter()
            .map(|(id, e)| self.info(id, &lock(e), false))
            .collect()
    }

    /// One client, with its loss history.
    pub fn get(&self, id: &str) -> Result<ClientInfo> {
        let entry = self.entry(id)?;
        let entry = lock(&entry);
        Ok(self.info(id, &entry, true))
    }

    /// `forward_backward` on client `id`; the batch's activations are reserved in the residency
    /// budget while it runs. Blocking (the forward and backward run here).
    pub fn forward_backward(
        &self,
        id: &str,
        sequences: &[Vec<u32>],
        loss_mask: &[Vec<f32>],
    ) -> Result<ForwardBackward> {
        let entry = self.entry(id)?;
        let config = self.engine.model().config();
        let prepared = prepare(
            config,
            sequences,
            loss_mask,
            self.options.max_tokens_per_call,
        )?;
        let mut entry = lock(&entry);
        let key = activation_key(id);
        self.engine.reserve_bytes(
            &key,
            activation_bytes(config, prepared.batch.sequences, prepared.batch.len),
        )?;
        let outcome = entry.client.forward_backward_prepared(&prepared);
        self.engine.release_bytes(&key);
        outcome
    }

    /// `optim_step` on client `id`.
    pub fn optim_step(&self, id: &str, params: &AdamWParams) -> Result<OptimStep> {
        let entry = self.entry(id)?;
        let mut entry = lock(&entry);
        entry.client.optim_step(params)
    }

    /// Decodes from the base with client `id`'s current delta, through the serving forward
    /// (the same [`Model::forward`] and next-token choice as `/v1/completions`). Blocking.
    pub fn sample(&self, id: &str, request: &SampleRequest) -> Result<Sample> {
        let entry = self.entry(id)?;
        let model = self.engine.model();
        let config = model.config();
        if request.prompt.is_empty() {
            return Err(Error::TrainingInput {
                field: Some("prompt"),
                message: "the prompt is empty".into(),
            });
        }
        check_tokens(config, &request.prompt, "prompt")?;
        let total = request.prompt.len().saturating_add(request.max_tokens);
        if request.max_tokens == 0 || total > config.max_position_embeddings {
            return Err(Error::TrainingInput {
                field: Some("max_tokens"),
                message: format!(
                    "max_tokens must be ≥ 1 and prompt + max_tokens ≤ the context {} (got {} + {})",
                    config.max_position_embeddings,
                    request.prompt.len(),
                    request.max_tokens
                ),
            });
        }
        let adapter = lock(&entry).client.to_adapter(format!("training:{id}"))?;
        generate(model, self.engine.tokenizer(), &adapter, request)
    }

    /// Writes client `id`'s adapter as PEFT files under the training directory (a folder named
    /// by its content id) and loads it through the serving path: registered as `name` (the id
    /// when `None`) and resident at once, pinned if `pin`. Blocking.
    pub fn save(&self, id: &str, name: Option<&str>, pin: bool) -> Result<Saved> {
        let entry = self.entry(id)?;
        let mut entry = lock(&entry);
        let (config, weights) = entry.client.peft_files(Some(&self.model_name))?;
        let adapter = adapter_id(&config, &weights);
        let dir = self.options.dir.join(&adapter);
        write_adapter_dir(&dir, &config, &weights)?;
        let name = name.unwrap_or(&adapter).to_string();
        let loaded = self.engine.load_adapter(&name, &dir, pin)?;
        entry.saved.push(adapter.clone());
        Ok(Saved {
            id: loaded.id,
            name,
            path: dir,
            step: entry.client.step(),
            rank: loaded.rank,
            bytes: loaded.bytes,
            pinned: loaded.pinned,
            evicted: loaded.evicted,
        })
    }

    /// Deletes client `id` and frees its reservation (saved adapters stay).
    pub fn delete(&self, id: &str) -> Result<()> {
        let removed = lock(&self.clients).remove(id);
        match removed {
            Some(_) => {
                self.engine.release_bytes(&reservation_key(id));
                Ok(())
            }
            None => Err(Error::UnknownTrainingClient(id.to_string())),
        }
    }
}

/// Greedy or sampled decoding of `request` with `adapter` through the serving forward.
fn generate(
    model: &Model,
    tokenizer: &crate::tokenizer::Tokenizer,
    adapter: &Adapter,
    request: &SampleRequest,
) -> Result<Sample> {
    use crate::engine::FinishReason;
    let mut cache = KvCache::default();
    let mut next: Vec<u32> = request.prompt.clone();
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    let mut text = String::new();
    for _ in 0..request.max_tokens {
        let logits = model
            .forward(&mut [SeqInput {
                tokens: &next,
                cache: &mut cache,
                adapter: Some(adapter),
            }])?
            .remove(0);
        let position = cache.len();
        let token = crate::engine::sample::choose(&logits, &request.sampling, &tokens, position);
        if tokenizer.is_stop(token) {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(token);
        text = tokenizer.decode(&tokens)?;
        if let Some(cut) = request
            .stop
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            text.truncate(cut);
            finish = FinishReason::Stop;
            break;
        }
        next = vec![token];
    }
    Ok(Sample {
        tokens,
        text,
        finish_reason: finish,
    })
}
