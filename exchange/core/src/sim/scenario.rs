//! A seeded fleet and arrival trace.

use crate::rng::TraceRng;
use cx_protocol::price::Rounding;
use cx_protocol::{ClassSet, DeterminismClass, Tier, TierSet};

/// Knobs of the scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScenarioConfig {
    /// Fixes everything below.
    pub seed: u64,
    /// Bundles in the fleet.
    pub bundles: usize,
    /// Agents (each with its own adapter).
    pub agents: usize,
    /// Arrivals.
    pub jobs: usize,
    /// Mean seconds between arrivals.
    pub mean_interarrival_s: f64,
    /// Zipf exponent of agent popularity.
    pub zipf_s: f64,
}

impl Default for ScenarioConfig {
    fn default() -> Self {
        Self {
            seed: 7,
            bundles: 48,
            agents: 1500,
            jobs: 6000,
            mean_interarrival_s: 0.25,
            zipf_s: 1.1,
        }
    }
}

/// A base model of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Id.
    pub id: String,
    /// |w|, bytes.
    pub bytes: u64,
    /// Parameters (FLOPs per token ≈ 2 × params).
    pub params: f64,
}

/// A device of the fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct SimBundle {
    /// Id.
    pub id: String,
    /// Total accelerator memory, bytes.
    pub memory_bytes: u64,
    /// Ingress, bits per second.
    pub bandwidth_bps: f64,
    /// The ask, wei per compute-second.
    pub price_wei_per_s: u64,
    /// FLOP/s.
    pub flops_per_s: f64,
    /// Round trip, seconds.
    pub rtt_s: f64,
    /// Base model (index) resident at the start.
    pub initial_base: Option<usize>,
    /// Observed failure rate.
    pub failure_rate: f64,
    /// Byte budget of the provider's adapter cache.
    pub adapter_budget_bytes: u64,
}

/// An agent: a base model and its own adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    /// Index into the models.
    pub model: usize,
    /// Adapter bytes.
    pub adapter_bytes: u64,
}

/// One arrival.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Seconds since the start.
    pub at_s: f64,
    /// Index into the agents.
    pub agent: usize,
    /// Context tokens.
    pub tokens: u32,
    /// Relative deadline, seconds.
    pub deadline_s: f64,
    /// Actual compute over the estimate (the noise every allocator sees alike).
    pub compute_noise: f64,
    /// A uniform draw the random allocator uses.
    pub pick: f64,
}

/// Fleet, agents and trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Base models.
    pub models: Vec<Model>,
    /// Devices.
    pub bundles: Vec<SimBundle>,
    /// Agents.
    pub agents: Vec<Agent>,
    /// Arrivals in time order.
    pub arrivals: Vec<Arrival>,
}

/// Every bundle here honours every class and offers T0–T2 (the simulation is about residency).
pub fn capabilities() -> (ClassSet, TierSet) {
    (
        DeterminismClass::ALL.into_iter().collect(),
        [Tier::T0, Tier::T1, Tier::T2].into_iter().collect(),
    )
}

impl Scenario {
    /// The scenario a config and seed fix.
    pub fn generate(config: &ScenarioConfig) -> Self {
        let mut rng = TraceRng::new(config.seed);
        // bf16 weights: bytes = 2 × params.
        let models: Vec<Model> = [
            ("llama-1b", 1.2e9),
            ("llama-8b", 8.0e9),
            ("qwen-14b", 14.0e9),
            ("llama-70b", 70.0e9),
        ]
        .into_iter()
        .map(|(id, params)| Model {
            id: id.to_owned(),
            bytes: (params * 2.0) as u64,
            params,
        })
        .collect();
        // Devices: (memory GB, price $/h, TFLOP/s). Links are drawn separately, so that some
        // cheap devices sit behind slow links — where ranking by price goes wrong.
        let devices = [
            (24.0, 0.35, 80.0),
            (48.0, 0.8, 150.0),
            (80.0, 1.9, 400.0),
            (141.0, 3.5, 700.0),
            (192.0, 5.0, 1000.0),
        ];
        let links = [1e9, 10e9, 25e9, 100e9];
        let bundles = (0..config.bundles)
            .map(|i| {
                let (mem_gb, price, tflops) = devices[rng.below(devices.len() as u64) as usize];
                let memory_bytes = (mem_gb * 1e9) as u64;
                // Start with the largest model that fits, sometimes a smaller one.
                let fitting: Vec<usize> = (0..models.len())
                    .filter(|m| models[*m].bytes + 4_000_000_000 <= memory_bytes)
                    .collect();
                let initial_base = if fitting.is_empty() || rng.next_f64() < 0.2 {
                    None
                } else {
                    Some(fitting[rng.below(fitting.len() as u64) as usize])
                };
                SimBundle {
                    id: format!("b{i:03}"),
                    memory_bytes,
                    bandwidth_bps: links[rng.below(links.len() as u64) as usize],
                    price_wei_per_s: units_per_hour_as_ask(price * (0.8 + 0.4 * rng.next_f64())),
                    // Decode-heavy serving reaches ~5 % of peak FLOP/s.
                    flops_per_s: tflops * 1e12 * 0.05,
                    rtt_s: 0.01 + 0.09 * rng.next_f64(),
                    initial_base,
                    failure_rate: 0.02 * rng.next_f64(),
                    // Providers keep ~5 % of memory for adapters, as vLLM's LoRA slots do.
                    adapter_budget_bytes: memory_bytes / 20,
                }
            })
            .collect();
        // Popular agents sit on small and mid models; a few on the 70B.
        let model_weights = [0.3, 0.4, 0.2, 0.1];
        let agents = (0..config.agents)
            .map(|_| {
                let model = pick_weighted(&mut rng, &model_weights);
                // Rank 16–128 adapters on every projection: ~0.2–2 % of the base.
                let share = 0.002 + 0.018 * rng.next_f64();
                Agent {
                    model,
                    adapter_bytes: (models[model].bytes as f64 * share) as u64,
                }
            })
            .collect();
        let zipf: Vec<f64> = (1..=config.agents)
            .map(|k| 1.0 / (k as f64).powf(config.zipf_s))
            .collect();
        let mut at_s = 0.0;
        let arrivals = (0..config.jobs)
            .map(|_| {
                at_s += rng.exponential(config.mean_interarrival_s);
                Arrival {
                    at_s,
                    agent: pick_weighted(&mut rng, &zipf),
                    tokens: 256 + rng.below(3840) as u32,
                    deadline_s: 4.0 + 26.0 * rng.next_f64(),
                    compute_noise: 0.9 + 0.3 * rng.next_f64(),
                    pick: rng.next_f64(),
                }
            })
            .collect();
        Self {
            models,
            bundles,
            agents,
            arrivals,
        }
    }
}

fn pick_weighted(rng: &mut TraceRng, weights: &[f64]) -> usize {
    let total: f64 = weights.iter().sum();
    let mut x = rng.next_f64() * total;
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    weights.len() - 1
}

/// A generated price per hour (whole units) as an integer ask per compute-second.
pub(crate) fn units_per_hour_as_ask(units_per_hour: f64) -> u64 {
    cx_protocol::price::wei_per_s_from_units_per_hour(units_per_hour, Rounding::Up)
        .expect("generated prices are finite and positive")
}
