//! `/metrics`: the engine's and the cache's counters in Prometheus text (version 0.0.4).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::AppState;

#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "service", responses((status = 200, description = "Prometheus text (version 0.0.4)", body = String, content_type = "text/plain")))]
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let m = state.engine.metrics();
    let (stats, cache_stats, resident, slot_bytes, shadow, aliases) = (
        m.stats,
        m.cache,
        m.resident,
        m.slot_bytes,
        m.slot_shadow_price,
        m.aliases,
    );
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, kind: &str, rows: Vec<(String, f64)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, value) in rows {
            out.push_str(&format!("{name}{labels} {}\n", sample(value)));
        }
    };
    let per_adapter = |m: &BTreeMap<String, usize>| {
        m.iter()
            .map(|(a, n)| (format!("{{adapter=\"{}\"}}", escape(a)), *n as f64))
            .collect::<Vec<_>>()
    };
    gauge(
        "cx_provider_running_sequences",
        "Sequences in the running batch, by adapter.",
        "gauge",
        per_adapter(&stats.running),
    );
    gauge(
        "cx_provider_waiting_sequences",
        "Sequences waiting to join the batch, by adapter.",
        "gauge",
        per_adapter(&stats.waiting),
    );
    gauge(
        "cx_provider_resident_adapters",
        "Adapters resident in memory.",
        "gauge",
        vec![(String::new(), cache_stats.resident_adapters as f64)],
    );
    gauge(
        "cx_provider_resident_adapter_bytes",
        "Bytes held by resident adapters.",
        "gauge",
        vec![(String::new(), cache_stats.resident_bytes as f64)],
    );
    gauge(
        "cx_provider_reserved_bytes",
        "Bytes of the cache budget reserved by training clients (state and running batches).",
        "gauge",
        vec![(String::new(), cache_stats.reserved_bytes as f64)],
    );
    gauge(
        "cx_provider_cache_budget_bytes",
        "Byte budget of the adapter cache.",
        "gauge",
        vec![(String::new(), cache_stats.budget_bytes as f64)],
    );
    gauge(
        "cx_provider_cache_hits_total",
        "Adapter lookups that found it resident.",
        "counter",
        vec![(String::new(), cache_stats.hits as f64)],
    );
    gauge(
        "cx_provider_cache_misses_total",
        "Adapter lookups that had to load from disk.",
        "counter",
        vec![(String::new(), cache_stats.misses as f64)],
    );
    gauge(
        "cx_provider_cache_evictions_total",
        "Adapters evicted to make room.",
        "counter",
        vec![(String::new(), cache_stats.evictions as f64)],
    );
    gauge(
        "cx_provider_held_prefixes",
        "Conversation prefixes whose KV cache is held between turns (SPEC §4).",
        "gauge",
        vec![(String::new(), cache_stats.held_prefixes as f64)],
    );
    gauge(
        "cx_provider_held_prefix_bytes",
        "Bytes of the cache budget held by conversation prefixes.",
        "gauge",
        vec![(String::new(), cache_stats.prefix_bytes as f64)],
    );
    gauge(
        "cx_provider_prefix_hits_total",
        "Continuations that found their prefix held (its prefill skipped).",
        "counter",
        vec![(String::new(), cache_stats.prefix_hits as f64)],
    );
    gauge(
        "cx_provider_prefix_reused_tokens_total",
        "Prompt tokens not prefilled because a held prefix had them.",
        "counter",
        vec![(String::new(), stats.prefix_reused_tokens as f64)],
    );
    gauge(
        "cx_provider_prefixes_kept_total",
        "Finished turns kept as prefixes (γ·s > h).",
        "counter",
        vec![(String::new(), cache_stats.prefixes_kept as f64)],
    );
    gauge(
        "cx_provider_prefixes_dropped_total",
        "Finished turns dropped (γ·s ≤ h).",
        "counter",
        vec![(String::new(), cache_stats.prefixes_dropped as f64)],
    );
    gauge(
        "cx_provider_continuation_probability",
        "γ: the probability a conversation continues, from observed continuations and a prior.",
        "gauge",
        vec![(String::new(), cache_stats.continuation_probability)],
    );
    gauge(
        "cx_provider_cache_loads_total",
        "Adapters made resident.",
        "counter",
        vec![(String::new(), cache_stats.loads as f64)],
    );
    gauge(
        "cx_provider_slot_shadow_price",
        "Expected discounted value (seconds of loading saved) given up to make room for a slot of slot_bytes (SPEC §4); +Inf when no room can be made.",
        "gauge",
        vec![(
            format!("{{slot_bytes=\"{slot_bytes}\"}}"),
            shadow.unwrap_or(f64::INFINITY),
        )],
    );
    gauge(
        "cx_provider_adapter_value_per_byte",
        "Expected discounted value per byte of each resident adapter.",
        "gauge",
        resident
            .iter()
            .map(|r| {
                let alias = aliases.get(&r.id).cloned().unwrap_or_default();
                (
                    format!(
                        "{{adapter=\"{}\",id=\"{}\",pinned=\"{}\"}}",
                        escape(&alias),
                        r.id,
                        r.pinned
                    ),
                    r.value_per_byte,
                )
            })
            .collect(),
    );
    gauge(
        "cx_provider_batch_steps_total",
        "Forward steps run.",
        "counter",
        vec![(String::new(), stats.steps as f64)],
    );
    gauge(
        "cx_provider_generated_tokens_total",
        "Tokens generated.",
        "counter",
        vec![(String::new(), stats.generated_tokens as f64)],
    );
    gauge(
        "cx_provider_max_batch_sequences",
        "Largest batch seen, in sequences.",
        "gauge",
        vec![(String::new(), stats.max_batch_seen as f64)],
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// A sample value as the Prometheus text format spells it: Rust prints `inf`, which
/// Prometheus does not parse; it wants `+Inf`, `-Inf`, `NaN`.
fn sample(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value == f64::INFINITY {
        "+Inf".into()
    } else if value == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        value.to_string()
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn infinities_are_spelled_as_prometheus_parses_them() {
        assert_eq!(super::sample(f64::INFINITY), "+Inf");
        assert_eq!(super::sample(f64::NEG_INFINITY), "-Inf");
        assert_eq!(super::sample(f64::NAN), "NaN");
        assert_eq!(super::sample(2.5), "2.5");
    }
}
