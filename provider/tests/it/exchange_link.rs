//! The exchange link without an exchange: `cx-provider keygen` and `serve --exchange` as an
//! operator meets them (a 0600 identity that is never silently replaced, one-line errors that
//! name the flag or file at fault) and the bundle an offer carries. The whole market path, with a
//! real exchange, is `exchange/cli/tests/provider.rs`.

use std::path::Path;
use std::process::Output;

use crate::common::{TempDir, tiny_model};

fn provider(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cx-provider"))
        .args(args)
        .env_remove("CX_EXCHANGE")
        .env_remove("CX_EXCHANGE_CA")
        .env_remove("CX_PROVIDER_IDENTITY")
        .output()
        .unwrap()
}

/// The one stderr line of a failed run.
fn error_line(args: &[&str]) -> String {
    let out = provider(args);
    assert!(!out.status.success(), "expected failure for {args:?}");
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(errors.len(), 1, "one error line, got: {err}");
    errors[0].to_owned()
}

fn serve_args<'a>(model: &'a str, identity: &'a str, exchange: &'a str) -> Vec<&'a str> {
    vec![
        "serve",
        "--model",
        model,
        "--port",
        "0",
        "--exchange",
        exchange,
        "--identity",
        identity,
        "--payout",
        "0x5555555555555555555555555555555555555555",
        "--operator",
        "op",
        "--ask-wei-per-s",
        "1000",
        "--bundle-id",
        "b",
        "--model-name",
        "tiny",
    ]
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn keygen_writes_a_0600_identity_and_refuses_to_replace_it_without_force() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("keygen");
    let key = dir.path().join("provider.key");
    let out = provider(&["keygen", "--out", path(&key)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let before = std::fs::read(&key).unwrap();
    let seed = serde_json::from_slice::<serde_json::Value>(&before).unwrap()["mldsa65_seed"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!printed.contains(&seed[2..]), "the seed is never printed");
    let err = error_line(&["keygen", "--out", path(&key)]);
    assert!(err.contains(path(&key)) && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(&key).unwrap(), before);
    let out = provider(&["keygen", "--out", path(&key), "--force"]);
    assert!(out.status.success());
    assert_ne!(std::fs::read(&key).unwrap(), before);
}

#[test]
fn serve_exchange_refuses_bad_input_on_one_line_naming_the_flag() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("serve-exchange");
    let (model, _) = tiny_model(dir.path(), 3);
    let key = dir.path().join("provider.key");
    assert!(provider(&["keygen", "--out", path(&key)]).status.success());

    // The other market flags are required with --exchange.
    let err = error_line(&["serve", "--model", path(&model), "--exchange", "https://x"]);
    assert!(
        err.contains("--identity") && err.contains("--payout"),
        "{err}"
    );
    // Not a URL the link speaks.
    let err = error_line(&serve_args(path(&model), path(&key), "ftp://127.0.0.1:9"));
    assert!(
        err.contains("--exchange") && err.contains("https://"),
        "{err}"
    );
    // Nothing listening: the first call (reading the exchange's key to pin) fails, naming
    // the URL.
    let err = error_line(&serve_args(path(&model), path(&key), "http://127.0.0.1:9"));
    assert!(err.contains("http://127.0.0.1:9/v1/exchange"), "{err}");
    // A follower's cap under its floor (the ask it starts at), and a margin out of range.
    let mut follow = serve_args(path(&model), path(&key), "https://127.0.0.1:9");
    follow.extend(["--ask-follow", "--ask-max-wei-per-s", "999"]);
    let err = error_line(&follow);
    assert!(
        err.contains("--ask-max-wei-per-s 999") && err.contains("floor"),
        "{err}"
    );
    let mut margin = serve_args(path(&model), path(&key), "https://127.0.0.1:9");
    margin.extend(["--ask-follow", "--ask-margin-bps", "-9000"]);
    assert!(error_line(&margin).contains("--ask-margin-bps"));
    // An identity others can read.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = error_line(&serve_args(path(&model), path(&key), "https://127.0.0.1:9"));
    assert!(
        err.contains("--identity") && err.contains("chmod 600"),
        "{err}"
    );
}

/// How the tests serve a base: `cpu`, an adapter cache of 10 MB, adapters from `root`.
fn serve_options(cpu: cx_kernels::CpuConfig, root: &Path) -> cx_provider::bases::ServeOptions {
    cx_provider::bases::ServeOptions {
        cpu,
        device: None,
        cache_bytes: 10_000_000,
        eviction: cx_provider::cache::EvictionPolicy::Lru,
        engine: cx_provider::engine::EngineConfig::default(),
        adapter_roots: vec![root.to_path_buf()],
        quantize: None,
    }
}

/// A link (not started: nothing is sent before `run`) whose primary base is `model_dir` as
/// `tiny`, with `store` loadable within `budget` bytes of bases (default: the primary's).
pub(crate) fn link_over(
    dir: &Path,
    model_dir: &Path,
    cpu: cx_kernels::CpuConfig,
    store: Vec<cx_provider::bases::BaseSource>,
    budget: Option<u64>,
) -> cx_provider::exchange_link::Link {
    use cx_provider::bases::{BaseSource, Bases, start_engine};
    use cx_provider::exchange_link::{Link, LinkConfig};
    let options = serve_options(cpu, dir);
    let engine = start_engine(model_dir, &options).unwrap();
    let budget = budget.unwrap_or(engine.model().weight_bytes() as u64);
    let primary = BaseSource::open("tiny", model_dir).unwrap();
    let bases = Bases::new((primary, engine, 0.5), store, budget, options).unwrap();
    Link::new(
        LinkConfig {
            exchange: "http://127.0.0.1:9".into(),
            exchange_ca: None,
            exchange_key_hash: None,
            operator: "op".into(),
            payout: cx_protocol::order::Address::repeat_byte(1),
            ask_wei_per_s: 7,
            tier_asks: Vec::new(),
            reserve_discount_bps: 1000,
            bundle_id: "b-0".into(),
            model_name: "tiny".into(),
            memory_bytes: 10_000_000,
            bandwidth_bps: 1e9,
            rtt_s: 0.005,
            fetched_adapters: dir.join("fetched"),
            fault: None,
            ask_follow: None,
        },
        cx_protocol::pq::Identity::from_seed([9; 32]),
        std::sync::Arc::new(bases),
    )
    .unwrap()
}

#[test]
fn the_offered_bundle_is_valid_and_names_the_loaded_base_and_resident_adapters_by_id() {
    let dir = TempDir::new("bundle");
    let (model_dir, config) = tiny_model(dir.path(), 4);
    let adapter = crate::common::adapters(dir.path(), &config, 1, &[4]).remove(0);
    let link = link_over(
        dir.path(),
        &model_dir,
        cx_kernels::CpuConfig::deterministic(),
        Vec::new(),
        None,
    );
    let loaded = link.engine().load_adapter("mine", &adapter, false).unwrap();
    // The second bundle offers the cx/matmul-f32 kernel market at T2 only, at the same ask.
    let matmul = link.matmul_bundle();
    matmul.validate().unwrap();
    assert_eq!(matmul.id, "b-0-matmul");
    assert_eq!(matmul.resident_bases, [cx_protocol::matmul::MATMUL_MODEL]);
    assert_eq!(matmul.fetchable_bases, Some(vec![]));
    assert_eq!(
        matmul.tiers.iter().collect::<Vec<_>>(),
        [cx_protocol::Tier::T2]
    );
    assert_eq!(matmul.price_wei_per_s, 7);
    assert!(matmul.flops_per_s > 0.0);
    let bundle = link.bundle();
    bundle.validate().unwrap();
    assert!(link.flops_per_s() > 0.0);
    assert_eq!(bundle.flops_per_s, link.flops_per_s());
    assert_eq!(bundle.resident_bases, ["tiny"]);
    assert_eq!(bundle.resident_adapters, [loaded.id]);
    assert_eq!(bundle.context_max as usize, config.max_position_embeddings);
    assert_eq!(
        (bundle.price_wei_per_s, bundle.provider.as_str()),
        (7, "op")
    );
    // No store: nothing to load, no room beside the adapter budget, the start's load rate.
    assert_eq!(bundle.fetchable_bases, Some(vec![]));
    assert_eq!(bundle.memory_bytes, 10_000_000);
    assert!(bundle.base_load_bps.unwrap() > 0.0);
}

/// The bundle a provider whose kernels run with `cpu` offers (a tiny model, no adapters).
fn bundle_on(cpu: cx_kernels::CpuConfig) -> cx_protocol::Bundle {
    let dir = TempDir::new("corpus");
    let (model_dir, _) = tiny_model(dir.path(), 4);
    let bundle = link_over(dir.path(), &model_dir, cpu, Vec::new(), None).bundle();
    bundle.validate().unwrap();
    bundle
}

// Issue 32 item 12: `--fast` (FMA) and `--gpu` providers advertised class D, though their bits
// differ from the deterministic kernels'; a T1/T3 replica on those kernels outvoted them and
// slashed an honest provider for being fast. Class D now names its kernel corpus, and only the
// deterministic CPU kernels have one.
#[test]
fn a_fast_provider_offers_d_inf_not_d() {
    use cx_protocol::DeterminismClass;
    let deterministic = bundle_on(cx_kernels::CpuConfig::deterministic());
    assert!(deterministic.determinism.contains(DeterminismClass::D));
    assert_eq!(
        deterministic.kernel_corpus.as_deref(),
        Some(cx_kernels::DETERMINISTIC_CORPUS)
    );
    let mut fast = cx_kernels::CpuConfig::deterministic();
    fast.mode = cx_kernels::Mode::Fast;
    let fast = bundle_on(fast);
    assert!(!fast.determinism.contains(DeterminismClass::D), "{fast:?}");
    assert!(fast.determinism.contains(DeterminismClass::DInf));
    assert_eq!(fast.kernel_corpus, None);
}

#[test]
fn a_provider_with_a_store_offers_its_bases_as_fetchable_with_room_for_them() {
    let dir = TempDir::new("fetchable");
    let (model_dir, _) = tiny_model(dir.path(), 4);
    let other = dir.path().join("other");
    cx_provider::model::generate::write_generated_model(&other, &crate::common::tiny_options(5))
        .unwrap();
    let stored = cx_provider::bases::BaseSource::open("other", &other).unwrap();
    let primary_bytes = cx_provider::bases::BaseSource::open("tiny", &model_dir)
        .unwrap()
        .bytes;
    let link = link_over(
        dir.path(),
        &model_dir,
        cx_kernels::CpuConfig::deterministic(),
        vec![stored.clone()],
        Some(primary_bytes + stored.bytes),
    );
    let bundle = link.bundle();
    bundle.validate().unwrap();
    assert_eq!(bundle.resident_bases, ["tiny"]);
    assert_eq!(bundle.fetchable_bases, Some(vec!["other".to_owned()]));
    // The adapter budget and the room a fetch may take.
    assert_eq!(bundle.memory_bytes, 10_000_000 + stored.bytes);
    // The residency report names the held base by content id, unpinned.
    let resident = link.bases().resident();
    assert_eq!(resident.len(), 1);
    assert_eq!(
        resident[0].id,
        cx_provider::model::content::checkpoint_id(&model_dir).unwrap()
    );
}
