//! The clearing benchmark behind `cx bench clearing`: the indexed engine against a full scan of
//! the same fleet, on the same intents, in one run.

use crate::engine::Engine;
use crate::objective::Weights;
use crate::rng::TraceRng;
use cx_protocol::{Bundle, DeterminismClass, Job, Tier};
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Sizes of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearingBenchConfig {
    /// Live bundles.
    pub bundles: usize,
    /// Intents cleared through the engine.
    pub intents: usize,
    /// Of those, how many also go through the full scan (it is slow; the rate is what counts).
    pub scan_intents: usize,
    /// Fixes fleet and intents.
    pub seed: u64,
}

/// What `cx bench clearing` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ClearingReport {
    /// Live bundles.
    pub bundles: usize,
    /// Intents cleared through the engine.
    pub intents: usize,
    /// Engine throughput on one core.
    pub intents_per_s: f64,
    /// Median latency of one clear, µs.
    pub p50_us: f64,
    /// 99th percentile latency of one clear, µs.
    pub p99_us: f64,
    /// Intents also cleared by full scan.
    pub scan_intents: usize,
    /// Full-scan throughput on one core.
    pub scan_intents_per_s: f64,
    /// intents_per_s / scan_intents_per_s.
    pub speedup_vs_scan: f64,
    /// Bundles the scan judges per second (feasibility and terms of one bundle for one job):
    /// the unit the engine's work is measured in.
    pub scan_bundles_per_s: f64,
    /// What one clear costs, in bundles judged by the scan (`scan_bundles_per_s /
    /// intents_per_s`): the bound a clear is measured against is one bundle judged (the
    /// chosen one); a scan is `bundles`.
    pub clear_cost_in_bundles: f64,
    /// Intents for which the engine and the scan chose differently (must be 0).
    pub disagreements: usize,
    /// Intents with no feasible bundle.
    pub unfilled: usize,
}

/// A synthetic market: bases of several sizes, adapters per base, bundles holding one or two
/// bases and a few dozen adapters, agents with Zipf popularity.
pub fn market(config: &ClearingBenchConfig) -> (Engine, Vec<Job>) {
    let mut rng = TraceRng::new(config.seed);
    let bases = 40usize;
    let adapters_per_base = 250usize;
    let base_bytes: Vec<u64> = (0..bases)
        .map(|m| {
            [
                2_400_000_000u64,
                16_000_000_000,
                28_000_000_000,
                140_000_000_000,
            ][m % 4]
        })
        .collect();
    let mut engine = Engine::new(Weights::default()).expect("default weights are valid");
    let all_classes = DeterminismClass::ALL;
    let all_tiers = [Tier::T0, Tier::T1, Tier::T2, Tier::T3];
    for i in 0..config.bundles {
        let memory_gb = [24u64, 48, 80, 141, 192][rng.below(5) as usize];
        let first = rng.below(bases as u64) as usize;
        let mut resident_bases = vec![format!("base-{first}")];
        if rng.next_f64() < 0.3 {
            resident_bases.push(format!("base-{}", rng.below(bases as u64)));
        }
        let resident_adapters = (0..rng.below(40))
            .map(|_| {
                format!(
                    "adapter-{first}-{}",
                    zipf_index(&mut rng, adapters_per_base)
                )
            })
            .collect();
        let bundle = Bundle {
            id: format!("bundle-{i:05}"),
            provider: format!("operator-{}", i % 97),
            device: String::new(),
            price_wei_per_s: crate::sim::scenario::units_per_hour_as_ask(
                0.3 + memory_gb as f64 / 40.0 * (0.7 + 0.6 * rng.next_f64()),
            ),
            memory_bytes: memory_gb * 1_000_000_000 / 2,
            bandwidth_bps: [1e9, 10e9, 25e9, 100e9][rng.below(4) as usize],
            rtt_s: 0.005 + 0.1 * rng.next_f64(),
            flops_per_s: (50.0 + 400.0 * rng.next_f64()) * 1e12,
            context_max: [8192, 32768, 131_072][rng.below(3) as usize],
            determinism: all_classes
                .iter()
                .copied()
                .filter(|_| rng.next_f64() < 0.7)
                .chain([DeterminismClass::S])
                .collect(),
            tiers: all_tiers
                .iter()
                .copied()
                .filter(|_| rng.next_f64() < 0.6)
                .chain([Tier::T0])
                .collect(),
            failure_rate: 0.02 * rng.next_f64(),
            resident_bases,
            resident_adapters,
            kernel_corpus: None,
            fetchable_bases: None,
            base_load_bps: None,
            resident_prefixes: vec![],
        };
        engine.upsert(bundle).expect("generated bundles are valid");
    }
    let jobs = (0..config.intents)
        .map(|k| {
            let base = zipf_index(&mut rng, bases);
            let adapter = zipf_index(&mut rng, adapters_per_base);
            let tokens = 256 + rng.below(8000) as u32;
            Job {
                agent: format!("agent-{base}-{adapter}"),
                base_model: format!("base-{base}"),
                adapter: (k % 5 != 0).then(|| format!("adapter-{base}-{adapter}")),
                base_bytes: base_bytes[base],
                adapter_bytes: if k % 5 != 0 {
                    base_bytes[base] / 800
                } else {
                    0
                },
                kv_bytes: u64::from(tokens) * 131_072,
                context_tokens: tokens,
                deadline_s: 2.0 + 60.0 * rng.next_f64(),
                determinism: all_classes[rng.below(3) as usize],
                tier: all_tiers[rng.below(4) as usize],
                compute_flops: 2.0 * base_bytes[base] as f64 / 2.0 * f64::from(tokens),
                value_wei: 0,
                max_price_wei: None,
                prefix: None,
            }
        })
        .collect();
    (engine, jobs)
}

fn zipf_index(rng: &mut TraceRng, n: usize) -> usize {
    // Inverse-CDF of a continuous power law with exponent ~1: cheap, skewed, in range.
    let u = rng.next_f64();
    (((n as f64 + 1.0).powf(u) - 1.0) as usize).min(n - 1)
}

/// Runs the benchmark.
pub fn run_clearing(config: &ClearingBenchConfig) -> ClearingReport {
    let (engine, jobs) = market(config);
    // Warm caches and branch predictors, untimed.
    for job in jobs.iter().take(1000) {
        black_box(engine.clear(job, None).ok());
    }
    let start = Instant::now();
    let mut unfilled = 0;
    for job in &jobs {
        if matches!(black_box(engine.clear(job, None)), Ok(None)) {
            unfilled += 1;
        }
    }
    let engine_s = start.elapsed().as_secs_f64();
    let mut latencies: Vec<f64> = jobs
        .iter()
        .map(|job| {
            let t = Instant::now();
            black_box(engine.clear(job, None).ok());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];

    let scanned = &jobs[..config.scan_intents.min(jobs.len())];
    let start = Instant::now();
    let scan_choices: Vec<Option<String>> = scanned
        .iter()
        .map(|j| {
            black_box(engine.clear_by_scan(j, None))
                .ok()
                .flatten()
                .map(|c| c.bundle_id)
        })
        .collect();
    let scan_s = start.elapsed().as_secs_f64();
    let disagreements = scanned
        .iter()
        .zip(&scan_choices)
        .filter(|(j, s)| engine.clear(j, None).ok().flatten().map(|c| c.bundle_id) != **s)
        .count();
    let intents_per_s = jobs.len() as f64 / engine_s;
    let scan_intents_per_s = scanned.len() as f64 / scan_s;
    ClearingReport {
        bundles: engine.len(),
        intents: jobs.len(),
        intents_per_s,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        scan_intents: scanned.len(),
        scan_intents_per_s,
        speedup_vs_scan: intents_per_s / scan_intents_per_s,
        scan_bundles_per_s: scan_intents_per_s * engine.len() as f64,
        clear_cost_in_bundles: scan_intents_per_s * engine.len() as f64 / intents_per_s,
        disagreements,
        unfilled,
    }
}
