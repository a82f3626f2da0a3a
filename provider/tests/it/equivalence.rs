//! The unmerged batched forward equals the merged-weight forward, and class D holds.

use cx_kernels::CpuConfig;
use cx_provider::lora::{Adapter, load_adapter};
use cx_provider::model::{KvCache, Model, SeqInput};

use crate::common::{TempDir, adapters, tiny_model};

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            let mut p = vec![256u32];
            p.extend((0..(2 + i % 5)).map(|k| (40 + 13 * i + 7 * k) as u32 % 256));
            p
        })
        .collect()
}

/// Runs every sequence in one batch: the prompts, then `steps` greedy decode steps, all
/// sequences together. Returns per sequence the logits of every step and the tokens fed.
fn run_batched(
    model: &Model,
    prompts: &[Vec<u32>],
    adapters: &[Option<&Adapter>],
    steps: usize,
) -> (Vec<Vec<Vec<f32>>>, Vec<Vec<u32>>) {
    let n = prompts.len();
    let mut caches = vec![KvCache::default(); n];
    let mut logits: Vec<Vec<Vec<f32>>> = vec![Vec::new(); n];
    let mut fed: Vec<Vec<u32>> = vec![Vec::new(); n];
    for step in 0..=steps {
        let next: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                if step == 0 {
                    prompts[i].clone()
                } else {
                    vec![argmax(logits[i].last().unwrap())]
                }
            })
            .collect();
        let mut inputs: Vec<SeqInput<'_>> = caches
            .iter_mut()
            .enumerate()
            .map(|(i, cache)| SeqInput {
                tokens: &next[i],
                cache,
                adapter: adapters[i],
            })
            .collect();
        let out = model.forward(&mut inputs).unwrap();
        for (i, l) in out.into_iter().enumerate() {
            logits[i].push(l);
            if step > 0 {
                fed[i].push(next[i][0]);
            }
        }
    }
    (logits, fed)
}

/// One sequence alone: the prompt, then the given tokens one by one.
fn run_alone(
    model: &Model,
    prompt: &[u32],
    fed: &[u32],
    adapter: Option<&Adapter>,
) -> Vec<Vec<f32>> {
    let mut cache = KvCache::default();
    let mut out = Vec::new();
    let step = |tokens: &[u32], cache: &mut KvCache| {
        model
            .forward(&mut [SeqInput {
                tokens,
                cache,
                adapter,
            }])
            .unwrap()
            .remove(0)
    };
    out.push(step(prompt, &mut cache));
    for t in fed {
        out.push(step(&[*t], &mut cache));
    }
    out
}

/// For a batch mixing 9 adapters of ranks 4, 8 and 16 (and different target sets) with one
/// base-only sequence, each sequence's logits at every step equal those of the sequence run
/// alone through a copy of the base with its delta merged (`W + s·B·A`).
/// Tolerance: |batched − merged| ≤ 1e-4 · max(1, max |merged|) (f32 rounding of two different
/// summation orders; the adapters move logits by far more, which the test also asserts).
#[test]
fn mixed_adapter_batch_equals_merged_weights() {
    let dir = TempDir::new("merged");
    let (model_dir, config) = tiny_model(dir.path(), 3);
    let model = Model::load(&model_dir, CpuConfig::deterministic().with_threads(2)).unwrap();
    let paths = adapters(dir.path(), &config, 9, &[4, 8, 16]);
    let loaded: Vec<Adapter> = paths
        .iter()
        .map(|p| load_adapter(p, &config, 64).unwrap())
        .collect();
    let ranks: std::collections::BTreeSet<usize> = loaded.iter().map(Adapter::rank).collect();
    assert_eq!(ranks.len(), 3, "the batch mixes ranks");
    let mut table: Vec<Option<&Adapter>> = loaded.iter().map(Some).collect();
    table.insert(4, None);
    let prompts = prompts(table.len());
    let (batched, fed) = run_batched(&model, &prompts, &table, 3);
    let mut worst = 0f32;
    for (i, adapter) in table.iter().enumerate() {
        let merged;
        let reference: &Model = match adapter {
            Some(a) => {
                merged = model.merged_with(a).unwrap();
                &merged
            }
            None => &model,
        };
        let alone = run_alone(reference, &prompts[i], &fed[i], None);
        let plain = run_alone(&model, &prompts[i], &fed[i], None);
        let mut moved = 0f32;
        for (step, (b, r)) in batched[i].iter().zip(&alone).enumerate() {
            let scale = r.iter().fold(1f32, |m, v| m.max(v.abs()));
            for (x, y) in b.iter().zip(r) {
                let err = (x - y).abs() / scale;
                worst = worst.max(err);
                assert!(err <= 1e-4, "sequence {i} step {step}: {x} vs merged {y}");
            }
            for (x, y) in b.iter().zip(&plain[step]) {
                moved = moved.max((x - y).abs());
            }
        }
        if adapter.is_some() {
            assert!(
                moved > 1e-2,
                "sequence {i}: the adapter must change the logits (moved {moved})"
            );
        } else {
            assert_eq!(moved, 0.0, "the base-only sequence gets no delta");
        }
    }
    eprintln!("worst relative error vs merged weights: {worst:e}");
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|l| l.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Class D: a sequence's logits are bit-identical whether it runs alone on one thread, in a
/// batch of other adapters on four threads, or joins a batch where neighbours prefill while
/// it decodes.
#[test]
fn class_d_bits_do_not_depend_on_neighbours_or_threads() {
    let dir = TempDir::new("class-d");
    let (model_dir, config) = tiny_model(dir.path(), 4);
    let one = Model::load(&model_dir, CpuConfig::deterministic().with_threads(1)).unwrap();
    let four = Model::load(&model_dir, CpuConfig::deterministic().with_threads(4)).unwrap();
    let paths = adapters(dir.path(), &config, 6, &[8, 16, 4]);
    let loaded: Vec<Adapter> = paths
        .iter()
        .map(|p| load_adapter(p, &config, 64).unwrap())
        .collect();
    let prompts = prompts(6);
    let target = 2;
    // Alone, one thread.
    let (alone, fed) = run_batched(&one, &prompts[target..=target], &[Some(&loaded[target])], 4);
    // In a batch of six adapters, four threads, target in the middle.
    let table: Vec<Option<&Adapter>> = loaded.iter().map(Some).collect();
    let (batched, batched_fed) = run_batched(&four, &prompts, &table, 4);
    assert_eq!(fed[0], batched_fed[target]);
    assert_eq!(bits(&alone[0]), bits(&batched[target]));
    // Neighbours join mid-stream: the target decodes while others prefill beside it.
    let mut cache = KvCache::default();
    let mut others: Vec<KvCache> = vec![KvCache::default(); 3];
    let mut got = Vec::new();
    for step in 0..=4usize {
        let tokens: Vec<u32> = if step == 0 {
            prompts[target].clone()
        } else {
            vec![fed[0][step - 1]]
        };
        let mut inputs = vec![];
        for (k, c) in others.iter_mut().enumerate().take(step.min(3)) {
            inputs.push(SeqInput {
                tokens: &prompts[k + 3][..],
                cache: c,
                adapter: Some(&loaded[(k + 4) % 6]),
            });
        }
        let at = inputs.len() / 2;
        inputs.insert(
            at,
            SeqInput {
                tokens: &tokens,
                cache: &mut cache,
                adapter: Some(&loaded[target]),
            },
        );
        let out = four.forward(&mut inputs).unwrap();
        got.push(out[at].clone());
        // Others that prefilled are done (they leave the batch); fresh caches for the next join.
        for c in others.iter_mut() {
            *c = KvCache::default();
        }
    }
    assert_eq!(bits(&alone[0]), bits(&got));
}

/// The KV cache: a prompt prefilled at once gives the bits of the same prompt fed token by
/// token.
#[test]
fn prefill_equals_token_by_token() {
    let dir = TempDir::new("prefill");
    let (model_dir, config) = tiny_model(dir.path(), 5);
    let model = Model::load(&model_dir, CpuConfig::deterministic()).unwrap();
    let adapter = load_adapter(&adapters(dir.path(), &config, 1, &[8])[0], &config, 64).unwrap();
    let prompt = [256u32, 10, 20, 30, 40, 50];
    let whole = run_alone(&model, &prompt, &[], Some(&adapter)).remove(0);
    let mut cache = KvCache::default();
    let mut last = Vec::new();
    for t in prompt {
        last = model
            .forward(&mut [SeqInput {
                tokens: &[t],
                cache: &mut cache,
                adapter: Some(&adapter),
            }])
            .unwrap()
            .remove(0);
    }
    assert_eq!(cache.len(), prompt.len());
    assert_eq!(bits(&[whole]), bits(&[last]));
}

/// Fast mode (candle's matmul for the base, FMA in the kernels) agrees with the deterministic
/// forward up to rounding (class D∞), adapters included.
#[test]
fn fast_mode_agrees_with_deterministic_mode() {
    let dir = TempDir::new("fast");
    let (model_dir, config) = tiny_model(dir.path(), 6);
    let exact = Model::load(&model_dir, CpuConfig::deterministic()).unwrap();
    let fast_config = CpuConfig {
        mode: cx_kernels::Mode::Fast,
        ..CpuConfig::deterministic()
    };
    let fast = Model::load(&model_dir, fast_config).unwrap();
    let paths = adapters(dir.path(), &config, 3, &[4, 16]);
    let loaded: Vec<Adapter> = paths
        .iter()
        .map(|p| load_adapter(p, &config, 64).unwrap())
        .collect();
    let table: Vec<Option<&Adapter>> = loaded.iter().map(Some).chain([None]).collect();
    let prompts = prompts(4);
    let (a, fed_a) = run_batched(&exact, &prompts, &table, 2);
    let (b, fed_b) = run_batched(&fast, &prompts, &table, 2);
    assert_eq!(fed_a, fed_b, "greedy choices agree");
    for (x, y) in a
        .iter()
        .flatten()
        .flatten()
        .zip(b.iter().flatten().flatten())
    {
        assert!((x - y).abs() <= 1e-4 * (1.0 + y.abs()), "{x} vs {y}");
    }
}
