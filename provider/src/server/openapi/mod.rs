//! `GET /openapi.json`: the API's OpenAPI 3.1 document, from the handlers' `#[utoipa::path]`
//! annotations, the request types the handlers read their bodies into (through the one door,
//! [`Body`](super::body::Body)), and the response shapes ([`responses`]).
//!
//! A request's schema is its type's: the fields the door accepts are the fields the document
//! lists, by construction. The parameters the completions accept only at their neutral value
//! (`best_of` = 1, `echo` = false, …) are no fields of theirs; they come into the document
//! from the handler's own table ([`NEUTRAL`](super::openai::request::NEUTRAL)), each with the
//! one value it accepts.
//!
//! The door's refusals (429 `rate_limited`, 503 `overloaded`, each with `Retry-After`) are
//! added to every operation here, in one place, as the door applies them to every route.

use axum::Json;
use serde_json::{Value, json};
use utoipa::OpenApi;

use super::{adapters, ask, metrics, openai, training};

pub(super) mod fields;
pub(super) mod responses;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "cx-provider",
        description = "A provider node of compute-exchange: one Llama base with many LoRA \
                       adapters in one batched forward. OpenAI-compatible completions (SSE \
                       streaming), vLLM-compatible adapter load and unload, LoRA training \
                       clients, the ask on the exchange, Prometheus metrics. Every error is \
                       OpenAI's shape plus `field`."
    ),
    paths(
        health,
        metrics::metrics,
        document,
        adapters::models,
        openai::completions,
        openai::chat_completions,
        adapters::load_lora,
        adapters::unload_lora,
        training::create,
        training::list,
        training::get,
        training::delete,
        training::forward_backward,
        training::optim_step,
        training::sample,
        training::save_weights,
        ask::get,
        ask::put,
    )
)]
struct ApiDoc;

/// The document: utoipa's, with the neutral parameters and the door's refusals added.
pub(super) fn openapi() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    let schemas = &mut doc["components"]["schemas"];
    for name in ["CompletionRequest", "ChatCompletionRequest"] {
        if let Some(properties) = schemas[name]["properties"].as_object_mut() {
            for (field, _, schema) in openai::request::NEUTRAL {
                let mut schema: Value = serde_json::from_str(schema).unwrap_or_else(|_| json!({}));
                schema["description"] = json!(
                    "Not implemented by this server: accepted only at its neutral value \
                     (or null), refused by name otherwise."
                );
                properties.insert((*field).to_string(), schema);
            }
        }
    }
    // utoipa writes u64 as `int64`, whose range a client (or schemathesis) takes to end at
    // 2⁶³ - 1: the server reads the whole u64 range.
    unsigned_64(schemas);
    let error = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}});
    let retry_after = |what: &str| json!({"Retry-After": {"description": what, "schema": {"type": "integer", "minimum": 1}}});
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for operation in operations.values_mut() {
            let responses = &mut operation["responses"];
            responses["429"] = json!({
                "description": "`rate_limited`: over this server's rate per IP address \
                                (--rate-per-ip, --rate-burst-ip)",
                "headers": retry_after("whole seconds until a request is allowed again"),
                "content": error,
            });
            if !super::limits::exempt_from_in_flight(path) {
                responses["503"] = json!({
                    "description": "`overloaded` (over --max-in-flight requests in flight), or \
                                    the engine cannot take the request now (`unavailable`, \
                                    `cache_full`, `training_limit`, `training_off`)",
                    "headers": retry_after("seconds after which trying again may succeed"),
                    "content": error,
                });
            }
        }
    }
    doc
}

/// Every `{"format": "int64", "minimum": ≥ 0}` under `schema` (the u64 fields have both)
/// becomes `uint64`, up to 2⁶⁴ - 1 where the field names no maximum of its own.
fn unsigned_64(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let unsigned = object.get("format").and_then(Value::as_str) == Some("int64")
                && object
                    .get("minimum")
                    .and_then(Value::as_f64)
                    .is_some_and(|m| m >= 0.0);
            if unsigned {
                object.insert("format".into(), json!("uint64"));
                object.entry("maximum").or_insert(json!(u64::MAX));
            }
            object.values_mut().for_each(unsigned_64);
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_64),
        _ => {}
    }
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "service", responses((status = 200, description = "this OpenAPI 3.1 document", body = Object)))]
pub(super) async fn document() -> Json<Value> {
    Json(openapi())
}

/// Liveness.
#[utoipa::path(get, path = "/health", operation_id = "health", tag = "service", responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")))]
pub(super) async fn health() -> &'static str {
    "ok"
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
        let schema = &doc["components"]["schemas"][schema];
        let names: BTreeSet<String> = schema["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{schema}"))
            .keys()
            .cloned()
            .collect();
        for required in schema["required"].as_array().into_iter().flatten() {
            assert!(names.contains(required.as_str().unwrap()), "{schema}");
        }
        assert_eq!(schema["additionalProperties"], false, "{schema}");
        names
    }

    fn set(fields: &[&str]) -> BTreeSet<String> {
        fields.iter().map(|f| f.to_string()).collect()
    }

    /// Each route's request schema has exactly the fields its handler's door accepts: its
    /// type's, as serde reads them (a `rename` or `skip` that utoipa did not follow would show
    /// here), and for the completions the neutral-only parameters.
    #[test]
    fn every_request_schema_is_the_type_its_handler_reads() {
        use super::super::body::fields;
        use super::super::openai::request::{self, NEUTRAL};

        let doc = openapi();
        let neutral: Vec<&str> = NEUTRAL.iter().map(|(n, _, _)| *n).collect();
        for (schema, fields, with_neutral) in [
            (
                "CompletionRequest",
                fields::<request::CompletionRequest>(),
                true,
            ),
            (
                "ChatCompletionRequest",
                fields::<request::ChatCompletionRequest>(),
                true,
            ),
            (
                "LoadLoraRequest",
                fields::<adapters::LoadLoraRequest>(),
                false,
            ),
            (
                "UnloadLoraRequest",
                fields::<adapters::UnloadLoraRequest>(),
                false,
            ),
            (
                "CreateClientRequest",
                fields::<training::CreateClientRequest>(),
                false,
            ),
            (
                "ForwardBackwardRequest",
                fields::<training::ForwardBackwardRequest>(),
                false,
            ),
            (
                "OptimStepRequest",
                fields::<training::OptimStepRequest>(),
                false,
            ),
            ("SampleRequest", fields::<training::SampleRequest>(), false),
            (
                "SaveWeightsRequest",
                fields::<training::SaveWeightsRequest>(),
                false,
            ),
            ("AskRequest", fields::<ask::AskRequest>(), false),
        ] {
            assert!(!fields.is_empty(), "{schema}");
            let mut expected = set(fields);
            if with_neutral {
                expected.extend(set(&neutral));
            }
            assert_eq!(properties(&doc, schema), expected, "{schema}");
        }
        // Every neutral value's schema parses (a typo would silently document `{}`).
        for (name, accepts, schema) in NEUTRAL {
            let schema: Value =
                serde_json::from_str(schema).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(schema.is_object(), "{name}");
            if let Some(value) = schema.get("const") {
                assert!(accepts(value), "{name}: its documented value is refused");
            }
        }
    }

    /// The uint64 rewrite set every u64's maximum to 2⁶⁴ - 1, `n`'s 8 too: the document
    /// offered `n` = 9, which the server refuses.
    #[test]
    fn a_u64_fields_own_maximum_survives_the_uint64_rewrite() {
        let doc = openapi();
        for schema in ["CompletionRequest", "ChatCompletionRequest"] {
            let n = &doc["components"]["schemas"][schema]["properties"]["n"];
            assert_eq!(n["format"], "uint64", "{schema}");
            assert_eq!(n["maximum"], u64::from(openai::MAX_CHOICES), "{schema}");
        }
        let seed = &doc["components"]["schemas"]["CompletionRequest"]["properties"]["seed"];
        assert_eq!(seed["maximum"], u64::MAX);
    }

    #[test]
    fn every_operation_documents_the_doors_refusals() {
        let doc = openapi();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let responses = &operation["responses"];
                assert!(
                    responses["429"]["headers"]["Retry-After"].is_object(),
                    "{method} {path}"
                );
                let exempt = path == "/health" || path == "/metrics";
                assert_eq!(responses["503"].is_object(), !exempt, "{method} {path}");
            }
        }
    }
}
