//! Conversation prefixes (SPEC §4): a continuation that finds its prefix held prefills only the
//! rest and answers bit for bit what a fresh run answers; the keep rule `γ·s > h`; held
//! prefixes evicted by value per byte beside adapters, never a pinned adapter.

use std::sync::Arc;

use cx_kernels::CpuConfig;
use cx_protocol::order::chat_prompt;
use cx_protocol::prefix::{continued_prefix_id, held_prefix_id};
use cx_provider::cache::{CacheConfig, EvictionPolicy, HeldPrefix, PrefixDecision, ResidencyCache};
use cx_provider::engine::{Conversation, Engine, EngineConfig, Event, GenerateRequest, Sampling};
use cx_provider::lora::{Adapter, load_adapter, write_random_adapter};
use cx_provider::model::{
    DType, GenModelOptions, KvCache, Model, Projection, SeqInput, write_generated_model,
};
use cx_provider::tokenizer::Tokenizer;

use crate::common::TempDir;

/// A tiny model with room for a few chat turns (the byte tokenizer spends a token per byte).
fn chat_model(dir: &std::path::Path) -> Arc<Model> {
    let path = dir.join("model");
    write_generated_model(
        &path,
        &GenModelOptions {
            hidden: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate: 48,
            vocab: 300,
            max_positions: 512,
            tie: false,
            dtype: DType::F32,
            seed: 5,
        },
    )
    .unwrap();
    Arc::new(Model::load(&path, CpuConfig::deterministic()).unwrap())
}

fn engine(model: &Arc<Model>) -> Engine {
    Engine::start(
        model.clone(),
        Arc::new(Tokenizer::generated()),
        ResidencyCache::new(CacheConfig::new(100_000_000, EvictionPolicy::ValuePerByte)),
        EngineConfig::default(),
    )
}

/// Greedy generation of `text` through the engine: the reply's text and tokens.
async fn generate(engine: &Engine, text: &str, hold: bool) -> (String, Vec<u32>) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    engine.submit(GenerateRequest {
        prompt: engine.tokenizer().encode(text).unwrap(),
        adapter: None,
        max_tokens: 12,
        stop: Vec::new(),
        sampling: Sampling::default(),
        events: tx,
        stream: true,
        conversation: hold.then(|| Conversation {
            model: "tiny".into(),
            prompt_text: text.to_string(),
        }),
    });
    let (mut reply, mut tokens) = (String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text { delta, token, .. } => {
                reply.push_str(&delta);
                tokens.push(token);
            }
            Event::Done { .. } => return (reply, tokens),
            Event::Failed(e) => panic!("generation failed: {e}"),
        }
    }
    panic!("the engine stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_that_hits_its_prefix_answers_what_a_fresh_run_answers() {
    let dir = TempDir::new("prefix-hit");
    let model = chat_model(dir.path());
    let holder = engine(&model);
    let turn1 = chat_prompt([("system", "You are terse."), ("user", "Name a colour.")]);
    let (reply, _) = generate(&holder, &turn1, true).await;
    let held = held_prefix_id("tiny", None, &turn1, &reply).unwrap();
    assert!(holder.holds_prefix(&held), "the first turn is held");
    assert_eq!(holder.residency().prefixes, vec![held.clone()]);
    let turn2 = chat_prompt([
        ("system", "You are terse."),
        ("user", "Name a colour."),
        ("assistant", reply.as_str()),
        ("user", "Another one?"),
    ]);
    assert_eq!(
        continued_prefix_id("tiny", None, &turn2).as_deref(),
        Some(held.as_str())
    );
    let (_, hit) = generate(&holder, &turn2, true).await;
    let stats = holder.metrics().cache;
    assert_eq!(stats.prefix_hits, 1, "the continuation found its prefix");
    assert!(!holder.holds_prefix(&held), "a hit takes the prefix out");
    assert_eq!(
        stats.held_prefixes, 1,
        "and the second turn is held in its place"
    );
    let reused = holder.metrics().stats.prefix_reused_tokens as usize;
    let turn1_tokens = Tokenizer::generated().encode(&turn1).unwrap().len();
    assert!(
        reused >= turn1_tokens,
        "reused {reused} of at least {turn1_tokens} tokens"
    );

    // The same continuation on a fresh engine, and on one that holds nothing: the same bits.
    let (_, fresh) = generate(&engine(&model), &turn2, false).await;
    assert_eq!(hit, fresh, "class D: a prefix hit changes no output token");
    let mut cache = KvCache::default();
    let mut tokens = Tokenizer::generated().encode(&turn2).unwrap();
    let mut reference = Vec::new();
    for _ in 0..hit.len() {
        let logits = model
            .forward(&mut [SeqInput {
                tokens: &tokens,
                cache: &mut cache,
                adapter: None,
            }])
            .unwrap()
            .remove(0);
        let best =
            (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b }) as u32;
        reference.push(best);
        tokens = vec![best];
    }
    assert_eq!(
        &hit[..],
        &reference[..hit.len()],
        "and the whole-prompt forward's"
    );
}

fn adapter(dir: &std::path::Path, model: &Model, seed: u64) -> Arc<Adapter> {
    let path = dir.join(format!("adapter-{seed}"));
    write_random_adapter(&path, model.config(), 4, &Projection::ALL, 0.05, seed).unwrap();
    Arc::new(load_adapter(&path, model.config(), 64).unwrap())
}

/// A held prefix of `len` tokens worth `saving_s` a hit.
fn prefix(model: &Model, id: &str, len: usize, saving_s: f64) -> HeldPrefix {
    let tokens: Vec<u32> = (0..len as u32).map(|t| t % 250).collect();
    let mut kv = KvCache::default();
    model
        .forward(&mut [SeqInput {
            tokens: &tokens,
            cache: &mut kv,
            adapter: None,
        }])
        .unwrap();
    HeldPrefix {
        id: id.into(),
        adapter: None,
        tokens,
        kv,
        saving_s,
    }
}

#[test]
fn the_keep_rule_keeps_a_prefix_iff_gamma_s_beats_its_holding_cost() {
    let dir = TempDir::new("prefix-keep");
    let model = chat_model(dir.path());
    let a = adapter(dir.path(), &model, 1);
    let p = prefix(&model, "p", 100, 0.0);
    let kv_bytes = p.kv.bytes() as u64;
    // Room for the adapter and not for the prefix beside it: h is the adapter's value.
    let mut cache = ResidencyCache::new(CacheConfig::new(
        a.bytes() + kv_bytes - 1,
        EvictionPolicy::ValuePerByte,
    ));
    cache.insert(a.clone(), false, 0.0).unwrap();
    for t in 0..10 {
        cache.lookup(a.id(), f64::from(t));
    }
    let h = cache.shadow_price(kv_bytes, 10.0).unwrap();
    assert!(h > 0.0);

    // γ = ½ (the prior) for the first turn: s just under 2h is dropped, the adapter stays.
    assert_eq!(cache.continuation_probability(), 0.5);
    let s = 0.99 * h / 0.5;
    let PrefixDecision::Dropped {
        value,
        holding_cost,
    } = cache.offer_prefix(prefix(&model, "p1", 100, s), 10.0)
    else {
        panic!("γ·s < h must drop");
    };
    assert!((value - 0.5 * s).abs() < 1e-12 && holding_cost == Some(h));
    assert!(!cache.holds_prefix("p1") && cache.contains(a.id()));

    // One turn ended and none continued: γ = (0 + 1)/(1 + 2). Now s just over h/γ keeps it,
    // and the adapter is what it evicts.
    let gamma = 1.0 / 3.0;
    assert!((cache.continuation_probability() - gamma).abs() < 1e-12);
    let s = 1.01 * h / gamma;
    assert_eq!(
        cache.offer_prefix(prefix(&model, "p2", 100, s), 10.0),
        PrefixDecision::Kept {
            evicted: vec![a.id().to_string()]
        }
    );
    assert!(cache.holds_prefix("p2") && !cache.contains(a.id()));

    // A continuation of p1 (dropped) still counts: γ rises with observed continuations.
    cache.note_continuation("p1");
    cache.note_continuation("p1"); // once per turn
    let (ended, continued) = (2.0, 1.0);
    assert!((cache.continuation_probability() - (continued + 1.0) / (ended + 2.0)).abs() < 1e-12);

    // Held bytes are budgeted: nothing else fits beside them.
    let stats = cache.stats();
    assert_eq!(stats.prefix_bytes, kv_bytes);
    assert_eq!((stats.prefixes_kept, stats.prefixes_dropped), (1, 1));
    assert_eq!(cache.free_bytes(), a.bytes() - 1);
}

#[test]
fn a_pinned_adapter_is_never_evicted_for_a_prefix() {
    let dir = TempDir::new("prefix-pin");
    let model = chat_model(dir.path());
    let a = adapter(dir.path(), &model, 2);
    let p = prefix(&model, "p", 100, 1e9);
    let mut cache = ResidencyCache::new(CacheConfig::new(
        a.bytes() + p.kv.bytes() as u64 - 1,
        EvictionPolicy::ValuePerByte,
    ));
    cache.insert(a.clone(), true, 0.0).unwrap();
    // However much it would save, no room can be made: h is undefined, the prefix dropped.
    assert_eq!(
        cache.offer_prefix(p, 1.0),
        PrefixDecision::Dropped {
            value: 0.5 * 1e9,
            holding_cost: None
        }
    );
    assert!(cache.contains(a.id()));
}

#[test]
fn held_prefixes_are_evicted_by_value_per_byte_beside_adapters() {
    let dir = TempDir::new("prefix-evict");
    let model = chat_model(dir.path());
    let hot = adapter(dir.path(), &model, 3);
    let newcomer = adapter(dir.path(), &model, 4);
    let cheap = prefix(&model, "cheap", 100, 1e-9);
    let dear = prefix(&model, "dear", 100, 1e6);
    let kv_bytes = cheap.kv.bytes() as u64;
    assert!(
        newcomer.bytes() <= kv_bytes,
        "one prefix's room fits the newcomer"
    );
    let mut cache = ResidencyCache::new(CacheConfig::new(
        hot.bytes() + 2 * kv_bytes,
        EvictionPolicy::ValuePerByte,
    ));
    cache.insert(hot.clone(), false, 0.0).unwrap();
    for t in 0..10 {
        cache.lookup(hot.id(), f64::from(t));
    }
    for p in [cheap, dear] {
        assert!(matches!(
            cache.offer_prefix(p, 10.0),
            PrefixDecision::Kept { .. }
        ));
    }
    assert_eq!(
        cache.held_prefixes(8),
        vec!["dear".to_string(), "cheap".to_string()]
    );
    // The newcomer needs room: the prefix worth least per byte goes, not the hot adapter nor
    // the valuable prefix.
    cache.lookup(newcomer.id(), 10.0);
    assert_eq!(
        cache.insert(newcomer.clone(), false, 10.0).unwrap(),
        Vec::<String>::new()
    );
    assert!(!cache.holds_prefix("cheap"));
    assert!(cache.holds_prefix("dear") && cache.contains(hot.id()));
    assert_eq!(cache.stats().prefix_evictions, 1);

    // At most `max_prefixes` are held: a more valuable turn displaces the least valuable one,
    // a less valuable one is dropped.
    let mut config = CacheConfig::new(10 * kv_bytes, EvictionPolicy::ValuePerByte);
    config.max_prefixes = 2;
    let mut cache = ResidencyCache::new(config);
    for (id, s) in [("a", 1.0), ("b", 2.0)] {
        assert!(matches!(
            cache.offer_prefix(prefix(&model, id, 100, s), 0.0),
            PrefixDecision::Kept { .. }
        ));
    }
    assert!(matches!(
        cache.offer_prefix(prefix(&model, "c", 100, 0.1), 0.0),
        PrefixDecision::Dropped { .. }
    ));
    assert!(matches!(
        cache.offer_prefix(prefix(&model, "d", 100, 100.0), 0.0),
        PrefixDecision::Kept { .. }
    ));
    assert_eq!(
        cache.held_prefixes(8),
        vec!["d".to_string(), "b".to_string()]
    );
}

#[test]
fn a_pinned_prefix_is_never_evicted_and_a_continuation_takes_a_copy() {
    let dir = TempDir::new("prefix-rent");
    let model = chat_model(dir.path());
    let hot = adapter(dir.path(), &model, 5);
    let rented = prefix(&model, "rented", 100, 1e-9);
    let kv_bytes = rented.kv.bytes() as u64;
    // One byte short of room for both.
    let mut cache = ResidencyCache::new(CacheConfig::new(
        hot.bytes() + kv_bytes - 1,
        EvictionPolicy::ValuePerByte,
    ));
    assert!(!cache.set_prefix_pinned("rented", true), "not held yet");
    assert!(matches!(
        cache.offer_prefix(rented, 0.0),
        PrefixDecision::Kept { .. }
    ));
    assert!(cache.set_prefix_pinned("rented", true));
    assert_eq!(cache.prefix_bytes("rented"), Some(kv_bytes));
    // Worth next to nothing, yet the adapter that needs its room cannot have it.
    assert!(cache.insert(hot.clone(), false, 10.0).is_err());
    assert!(cache.holds_prefix("rented") && !cache.contains(hot.id()));
    // A continuation takes a copy; the rented state stays held, and a retried turn leaves it.
    let taken = cache.take_prefix("rented", None).unwrap();
    assert_eq!(taken.kv.bytes() as u64, kv_bytes);
    assert!(cache.holds_prefix("rented"));
    assert_eq!(cache.held_prefixes(8), vec!["rented".to_string()]);
    // Unpinned at the term's end, it is inventory again: the arrival that needs room takes it.
    assert!(cache.set_prefix_pinned("rented", false));
    cache.insert(hot.clone(), false, 20.0).unwrap();
    assert!(!cache.holds_prefix("rented") && cache.contains(hot.id()));
}
