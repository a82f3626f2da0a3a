//! The OpenAI-compatible door: `POST /v1/chat/completions` and `POST /v1/completions`, streaming
//! or not, for agents written against the OpenAI API (the official clients with only `base_url`
//! and `api_key` set).
//!
//! The API key is a **session key**: the bearer secret of a `SessionGrant` the agent signed
//! ([`super::sessions`]). Each call becomes a job cleared like any intent — the grant's defaults
//! (deadline, tier, class, price limit) unless the call's `cx` object overrides them — held on
//! the grant's tab within its spend cap, and answered when a provider's result is in (or with a
//! 504 at the deadline, when the hold is released and nothing is charged).
//!
//! `model` is a catalog model, or an adapter's content id (as vLLM serves adapters under their
//! names; the adapter's `base_model_name_or_path` must then be a catalog model). A chat's
//! `messages` go into the job's request as they are, and the provider renders them with its
//! model's own template. `temperature`, `top_p`, `presence_penalty`, `frequency_penalty`, `seed`
//! and `stop` are carried in the request as integers ([`SamplingParams`]); a sampled call
//! without a seed gets one drawn here, so the job's bytes are fixed and every replica of it
//! (T1/T3) draws the same. `n` above 1, `logprobs`, tools and every other field that would
//! change the output are refused by name, never ignored.

use super::error::ApiError;
use super::extract::AppJson;
use super::extract::bearer;
use super::state::AppState;
use crate::books::{JobStatus, Session};
use crate::intake::{Intake, now_s};
use crate::jobs::placement::Want;
use crate::sweeps::SWEEP_PERIOD;
use crate::task_router::Target;
use alloy::primitives::B256;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cx_protocol::order::request::{MAX_STOP_BYTES, MAX_STOP_SEQUENCES};
use cx_protocol::order::{ChatMessage, InferenceRequest, SamplingParams};
use cx_protocol::wire::Accepted;
use cx_protocol::wire::Output;
use cx_protocol::{DeterminismClass, Tier};
use serde::Deserialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::time::Duration;

/// `max_tokens` when a call names none (the job is priced by its context, so it needs a bound).
pub(super) const DEFAULT_MAX_TOKENS: u32 = 256;

/// Longest deadline a call may ask for, seconds: what settlement signers allow past a grant's
/// expiry (`SessionGrant::last_deadline_s`).
const MAX_DEADLINE_S: u64 = cx_protocol::order::SessionGrant::MAX_CALL_DEADLINE_S;

/// Both routes' body: OpenAI's fields this door implements, and `cx`. Unknown fields are refused
/// by name.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct DoorRequest {
    model: String,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<Prompt>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    stop: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    /// The draws' seed; a sampled call without one gets one drawn by the exchange, written
    /// into the job's request (and so into what every replica runs).
    #[serde(default)]
    seed: Option<u64>,
    /// An end-user id for the caller's own bookkeeping; changes nothing.
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
    #[serde(default)]
    cx: Option<CxFields>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Message {
    role: String,
    content: Content,
    /// A participant name; not passed to the model's template (refused when set, as it would
    /// change the prompt some templates render).
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Part {
    Text { text: String },
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Batch(Vec<String>),
}

/// The exchange's own fields: what a call overrides of its session's defaults.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CxFields {
    /// Seconds after arrival by which the result must be back.
    #[serde(default)]
    deadline_in_s: Option<u64>,
    #[serde(default)]
    tier: Option<Tier>,
    #[serde(default)]
    determinism: Option<DeterminismClass>,
    /// The most the call may cost, wei (a decimal string), or `"market"`: cleared under the
    /// market's quote for the call (its ask, modulated by the deadline and tier), within what
    /// the session has left.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^([0-9]{1,38}|market)$")]
    max_price_wei: Option<Limit>,
    /// The adapter, by content id, when `model` names the base.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^0x[0-9a-fA-F]{64}$")]
    adapter_id: Option<B256>,
    /// With a routed `model` (`task:<name>`, `cx/auto`, `cx/fanout:N`): the lowest catalog
    /// quality an arm may have, in [0, 1] (a ceiling the router gates on before scoring).
    #[serde(default)]
    min_quality: Option<f64>,
}

/// A call's price limit: wei, or left to the market.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Limit {
    Wei(u128),
    Market,
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        if value == "market" {
            return Ok(Self::Market);
        }
        cx_protocol::price::wei_string::deserialize(value)
            .map(Self::Wei)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "expected wei (a decimal string) or \"market\": {e}"
                ))
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai", request_body = DoorRequest, security(("session_key" = [])), responses((status = 200, description = "an OpenAI `chat.completion` (or, with `stream: true`, `chat.completion.chunk` server-sent events) with a `cx` object naming the job", body = Object), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    AppJson(request): AppJson<DoorRequest>,
) -> Result<Response, ApiError> {
    door(state, headers, request, Kind::Chat).await
}

#[utoipa::path(post, path = "/v1/completions", tag = "openai", request_body = DoorRequest, security(("session_key" = [])), responses((status = 200, description = "an OpenAI `text_completion`", body = Object), (status = "4XX", description = "refused: `{error: {code, message, field}}`", body = crate::api::error::ErrorBody), (status = "5XX", description = "failed inside the server", body = crate::api::error::ErrorBody)))]
pub(super) async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    AppJson(request): AppJson<DoorRequest>,
) -> Result<Response, ApiError> {
    door(state, headers, request, Kind::Completion).await
}

async fn door(
    state: AppState,
    headers: HeaderMap,
    request: DoorRequest,
    kind: Kind,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let intake = state.intake()?;
    let now = now_s();
    let session = intake.authorize(bearer(&headers)?, now).await?;
    let call = Call::of(&request, kind)?;
    let want = want(intake, &session, &request, now).await?;
    if let Some(target) = Target::parse(&want.model)
        .map_err(|e| ApiError::from(e).map_field(door_field))?
        .filter(|t| t.fan_out > 1)
    {
        return fan_out(intake, &session, &target, &want, call, kind, now).await;
    }
    let accepted = intake
        .submit_call(&session, &want, &call.request, now)
        .await
        .map_err(|e| ApiError::from(e).map_field(door_field));
    let accepted = match accepted {
        Ok(a) => {
            state
                .metrics()
                .accepted(started.elapsed().as_micros() as u64);
            a
        }
        Err(err) => {
            state
                .metrics()
                .refused(err.code(), started.elapsed().as_micros() as u64);
            return Err(err);
        }
    };
    // The sweep expires the job within a period of its deadline; wait a little past both.
    let until = tokio::time::Instant::now()
        + Duration::from_secs(want.deadline_s.saturating_sub(now))
        + 2 * SWEEP_PERIOD;
    let reply = Reply {
        kind,
        // A routed call says the model that answers, as OpenAI's answers do.
        model: accepted
            .routed_to
            .clone()
            .unwrap_or_else(|| request.model.clone()),
        created: now,
        accepted,
        include_usage: call.include_usage,
    };
    if call.stream {
        // Subscribed right after the job was committed: a piece a fast provider streamed before
        // this line is lost from the stream, not from the answer (the offsets skip what does
        // not follow, and the signed result fills the gap).
        let text = intake.waiters().subscribe_text(reply.accepted.job_id);
        return Ok(stream(state, reply, until, text));
    }
    let output = outcome(intake, reply.accepted.job_id, until).await?;
    Ok(AppJson(reply.whole(&output)).into_response())
}

/// `model: "cx/fanout:N"`: the call goes to the top N arms the task router ranks for it, one
/// job each (each held on the session and paid for), and the answer is the one the weightless
/// synthesiser picks among those that came back (the byte majority for class D, the medoid
/// otherwise: [`cx_exchange::routing::fanout::synthesise`]). `cx.fanout` in the answer names
/// every arm and job, which answered, the one chosen and how far the answers agreed. An arm
/// no bundle takes (or past the session's room) is left out once another was placed. Not
/// streamed: the answer is chosen after every arm has answered (or its deadline passed).
#[allow(clippy::too_many_arguments)] // the door's parts; a struct would only rename them
async fn fan_out(
    intake: &Intake,
    session: &Session,
    target: &Target,
    want: &Want,
    call: Call,
    kind: Kind,
    now: u64,
) -> Result<Response, ApiError> {
    let door_error = |e: crate::Error| ApiError::from(e).map_field(door_field);
    if call.stream {
        return Err(ApiError::invalid(
            "stream",
            "cx/fanout:N answers once every arm has answered: it does not stream",
        ));
    }
    let arms = intake
        .route(target, want, &call.request, now)
        .map_err(door_error)?;
    let mut placed: Vec<(String, Accepted)> = Vec::new();
    let mut left_out: Vec<Value> = Vec::new();
    for arm in &arms {
        match intake.submit_call(session, arm, &call.request, now).await {
            Ok(accepted) => placed.push((arm.model.clone(), accepted)),
            Err(err) if !placed.is_empty() => {
                left_out.push(json!({"model": arm.model, "error": err.to_string()}));
            }
            Err(err) => return Err(door_error(err)),
        }
    }
    let until = tokio::time::Instant::now()
        + Duration::from_secs(want.deadline_s.saturating_sub(now))
        + 2 * SWEEP_PERIOD;
    // Each wait ends at its job's end or at `until`: in turn, they take as long as the slowest.
    let mut answers: Vec<(usize, Output)> = Vec::new();
    let mut first_error = None;
    for (i, (_, accepted)) in placed.iter().enumerate() {
        match outcome(intake, accepted.job_id, until).await {
            Ok(output) => answers.push((i, output)),
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
    }
    let texts: Vec<&str> = answers.iter().map(|(_, o)| o.text.as_str()).collect();
    let Some(fused) = cx_exchange::routing::fanout::synthesise(&texts, want.determinism) else {
        return Err(first_error.unwrap_or_else(|| ApiError::Internal("no arm was placed".into())));
    };
    let (chosen, output) = &answers[fused.chosen];
    let (model, accepted) = &placed[*chosen];
    let reply = Reply {
        kind,
        model: model.clone(),
        created: now,
        accepted: accepted.clone(),
        include_usage: call.include_usage,
    };
    let mut body = reply.whole(output);
    body["cx"]["fanout"] = json!({
        "arms": placed.iter().enumerate().map(|(i, (model, a))| json!({
            "model": model,
            "job_id": a.job_id,
            "held_wei": a.held_wei.to_string(),
            "answered": answers.iter().any(|(j, _)| *j == i),
        })).collect::<Vec<_>>(),
        "left_out": left_out,
        "chosen": model,
        "agreement": fused.agreement,
        "majority": fused.majority,
    });
    Ok(AppJson(body).into_response())
}

/// What one call asks for, checked.
struct Call {
    request: InferenceRequest,
    stream: bool,
    include_usage: bool,
}

impl Call {
    fn of(r: &DoorRequest, kind: Kind) -> Result<Self, ApiError> {
        if let Some(n) = r.n
            && n != 1
        {
            return Err(ApiError::invalid("n", "one choice per call: n must be 1"));
        }
        let sampling = sampling(r)?;
        let stream = r.stream.unwrap_or(false);
        if r.stream_options.is_some() && !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "only allowed with stream: true",
            ));
        }
        let max_tokens = match (r.max_completion_tokens, r.max_tokens) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::invalid(
                    "max_completion_tokens",
                    "differs from max_tokens: send one",
                ));
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => DEFAULT_MAX_TOKENS,
        };
        if max_tokens == 0 {
            return Err(ApiError::invalid("max_tokens", "must be at least 1"));
        }
        let (prompt, messages) = match kind {
            Kind::Chat => {
                if r.prompt.is_some() {
                    return Err(ApiError::invalid(
                        "prompt",
                        "chat completions take `messages`; `prompt` is for /v1/completions",
                    ));
                }
                (
                    String::new(),
                    chat_messages(r.messages.as_deref().unwrap_or_default())?,
                )
            }
            Kind::Completion => {
                if r.messages.is_some() {
                    return Err(ApiError::invalid(
                        "messages",
                        "completions take `prompt`; `messages` is for /v1/chat/completions",
                    ));
                }
                let prompt = match &r.prompt {
                    Some(Prompt::One(p)) => p.clone(),
                    Some(Prompt::Batch(b)) if b.len() == 1 => b[0].clone(),
                    Some(Prompt::Batch(_)) => {
                        return Err(ApiError::invalid(
                            "prompt",
                            "one prompt per call (send a list of one, or a string)",
                        ));
                    }
                    None => return Err(ApiError::invalid("prompt", "required")),
                };
                (prompt, Vec::new())
            }
        };
        if prompt.is_empty() && messages.iter().all(|m| m.content.is_empty()) {
            return Err(ApiError::invalid(
                if kind == Kind::Chat {
                    "messages"
                } else {
                    "prompt"
                },
                "is empty",
            ));
        }
        Ok(Self {
            request: InferenceRequest {
                prompt,
                messages,
                max_tokens,
                sampling,
            },
            stream,
            include_usage: r.stream_options.as_ref().is_some_and(|o| o.include_usage),
        })
    }
}

/// The chat's messages as the request carries them (the provider renders them with its model's
/// own template); text parts are joined, a message's `name` is refused rather than dropped.
fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "must hold at least one message",
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if m.role.is_empty() {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    "must not be empty",
                ));
            }
            if m.name.is_some() {
                return Err(ApiError::invalid(
                    format!("messages[{i}].name"),
                    "participant names are not supported (they would change the rendered prompt)",
                ));
            }
            let content = match &m.content {
                Content::Text(t) => t.clone(),
                Content::Parts(parts) => parts
                    .iter()
                    .map(|Part::Text { text }| text.as_str())
                    .collect(),
            };
            Ok(ChatMessage {
                role: m.role.clone(),
                content,
            })
        })
        .collect()
}

/// A value of OpenAI's float parameters in thousandths, or a 400 naming it when it is outside
/// `range` (given in thousandths) or not finite.
fn milli(
    value: Option<f64>,
    default: f64,
    field: &'static str,
    range: std::ops::RangeInclusive<i64>,
) -> Result<i64, ApiError> {
    let v = value.unwrap_or(default);
    let m = (v * 1000.0).round();
    if !v.is_finite() || !(*range.start() as f64..=*range.end() as f64).contains(&m) {
        return Err(ApiError::invalid(
            field,
            format!(
                "{v} is outside {} to {}",
                *range.start() as f64 / 1000.0,
                *range.end() as f64 / 1000.0
            ),
        ));
    }
    Ok(m as i64)
}

/// The call's sampling, as the request carries it (thousandths; see [`SamplingParams`]): `None`
/// when it decodes greedily with nothing to stop at. A sampled call without a `seed` gets one
/// drawn here, so the job — and every replica of it — runs one fixed draw.
fn sampling(r: &DoorRequest) -> Result<Option<SamplingParams>, ApiError> {
    let temperature_milli = milli(r.temperature, 0.0, "temperature", 0..=2000)? as u32;
    let top_p_milli = milli(r.top_p, 1.0, "top_p", 1..=1000)? as u32;
    let presence_penalty_milli =
        milli(r.presence_penalty, 0.0, "presence_penalty", -2000..=2000)? as i32;
    let frequency_penalty_milli =
        milli(r.frequency_penalty, 0.0, "frequency_penalty", -2000..=2000)? as i32;
    let stop: Vec<String> = match &r.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::invalid("stop", "a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid("stop", "a string or a list of strings")),
    };
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    if stop.len() > MAX_STOP_SEQUENCES || stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "at most {MAX_STOP_SEQUENCES} stop sequences of at most {MAX_STOP_BYTES} bytes"
            ),
        ));
    }
    let greedy = temperature_milli == 0
        && presence_penalty_milli == 0
        && frequency_penalty_milli == 0
        && stop.is_empty();
    if greedy {
        return Ok(None);
    }
    let seed = match r.seed {
        Some(seed) => seed,
        None => {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes)
                .map_err(|e| ApiError::Internal(format!("drawing a seed: {e}").into()))?;
            u64::from_le_bytes(bytes)
        }
    };
    Ok(Some(SamplingParams {
        temperature_milli,
        top_p_milli,
        top_k: 0,
        presence_penalty_milli,
        frequency_penalty_milli,
        seed,
        stop,
    }))
}

/// What the call wants: its session's defaults, with the call's `cx` overrides.
async fn want(
    intake: &Intake,
    session: &Session,
    request: &DoorRequest,
    now: u64,
) -> Result<Want, ApiError> {
    let grant = &session.grant;
    let cx = request.cx.as_ref();
    let in_s = cx
        .and_then(|c| c.deadline_in_s)
        .unwrap_or(grant.default_deadline_s);
    if in_s == 0 || in_s > MAX_DEADLINE_S {
        return Err(ApiError::invalid(
            "cx.deadline_in_s",
            format!("must be within 1..={MAX_DEADLINE_S} seconds"),
        ));
    }
    let (max_price_wei, market_limit) = match cx.and_then(|c| c.max_price_wei) {
        Some(Limit::Wei(0)) => {
            return Err(ApiError::invalid("cx.max_price_wei", "must be above zero"));
        }
        Some(Limit::Wei(wei)) => (wei, false),
        // The quote gates the bundles; what the session may still spend bounds the charge.
        Some(Limit::Market) => (
            grant.spend_cap_wei.saturating_sub(session.spent_wei).max(1),
            true,
        ),
        None => (grant.default_max_price_wei, false),
    };
    let min_tier = cx.and_then(|c| c.tier).unwrap_or(grant.default_tier);
    if min_tier == Tier::Attested {
        return Err(ApiError::invalid(
            "cx.tier",
            "the attested tier is not offered: T0 to T3",
        ));
    }
    let (model, adapter_id) = model_and_adapter(intake, &request.model, cx).await?;
    let min_quality = match cx.and_then(|c| c.min_quality) {
        None => 0.0,
        Some(q) if !(0.0..=1.0).contains(&q) => {
            return Err(ApiError::invalid("cx.min_quality", "must be within [0, 1]"));
        }
        Some(_) if !Target::parse(&model).is_ok_and(|t| t.is_some()) => {
            return Err(ApiError::invalid(
                "cx.min_quality",
                "gates the router's arms: it applies only when `model` names a task \
                 (task:<name>, cx/auto, cx/fanout:N)",
            ));
        }
        Some(q) => q,
    };
    Ok(Want {
        model,
        adapter_id,
        deadline_s: now + in_s,
        max_price_wei,
        min_tier,
        determinism: cx
            .and_then(|c| c.determinism)
            .unwrap_or(grant.default_determinism),
        market_limit,
        route: None,
        min_quality,
    })
}

/// `model` as a catalog model, or as an adapter id whose base (its config's
/// `base_model_name_or_path`) is a catalog model.
async fn model_and_adapter(
    intake: &Intake,
    model: &str,
    cx: Option<&CxFields>,
) -> Result<(String, Option<B256>), ApiError> {
    let explicit = cx.and_then(|c| c.adapter_id);
    let Some(adapter) = adapter_id(model) else {
        return Ok((model.to_owned(), explicit));
    };
    if explicit.is_some_and(|e| e != adapter) {
        return Err(ApiError::invalid(
            "cx.adapter_id",
            "names another adapter than `model`",
        ));
    }
    let stored = intake
        .books()
        .adapter(&hex::encode(adapter))
        .await?
        .ok_or_else(|| {
            ApiError::from(crate::Error::UnknownAdapter).map_field(|_| "model".to_owned())
        })?;
    let base = intake.adapter_base(&stored.config).ok_or_else(|| {
        ApiError::invalid(
            "model",
            "this adapter's base_model_name_or_path is not a catalog model: name the base \
                 model in `model` and the adapter in `cx.adapter_id`",
        )
    })?;
    Ok((base, Some(adapter)))
}

/// A 64-hex-digit content id (with or without `0x`), as an adapter is named.
fn adapter_id(model: &str) -> Option<B256> {
    let digits = model.strip_prefix("0x").unwrap_or(model);
    (digits.len() == 64 && digits.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// An intake error's field, renamed to the door's fields.
fn door_field(field: &str) -> String {
    match field {
        "intent.order.want" | "intent.order.adapter_id" => "model",
        "intent.order.deadline_s" | "deadline_s" => "cx.deadline_in_s",
        "request.max_tokens" => "max_tokens",
        "request.prompt" | "request" => "messages",
        "intent.order.tab_id" => "api_key",
        other => other,
    }
    .to_owned()
}

/// The job's output once a provider returned it, or why there is none.
async fn outcome(
    intake: &Intake,
    job_id: B256,
    until: tokio::time::Instant,
) -> Result<Output, ApiError> {
    let job = intake
        .wait(job_id, until)
        .await?
        .ok_or(ApiError::NotFound { what: "job".into() })?;
    // A replicated job whose own provider was outvoted is `failed` (never paid) but carries the
    // majority's verified output, which is the buyer's answer.
    let status = if job.output_released() {
        JobStatus::Done
    } else {
        job.status
    };
    match (status, job.result) {
        (JobStatus::Done, Some(result)) => Ok(serde_json::from_value(result)
            .map_err(|e| ApiError::Internal(Box::new(crate::Error::Json(e))))?),
        (JobStatus::Cancelled, _) => Err(ApiError::Conflict {
            field: None,
            message: "the job was cancelled (DELETE /v1/jobs/{id}); nothing was charged".into(),
        }),
        (JobStatus::Refunded, _) => Err(crate::Error::Refunded {
            job_id,
            reason: job
                .events
                .iter()
                .rev()
                .find(|e| e.status == "released")
                .and_then(|e| e.detail["reason"].as_str())
                .map(str::to_owned),
        }
        .into()),
        _ => Err(crate::Error::DeadlineMissed {
            job_id,
            deadline_s: job.deadline_s,
        }
        .into()),
    }
}

/// What an answer says besides the output.
struct Reply {
    kind: Kind,
    model: String,
    created: u64,
    accepted: Accepted,
    include_usage: bool,
}

impl Reply {
    fn id(&self) -> String {
        let prefix = match self.kind {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        };
        format!("{prefix}-{}", hex::encode(self.accepted.job_id))
    }

    fn usage(output: &Output) -> Value {
        json!({
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
            "total_tokens": output.prompt_tokens + output.completion_tokens,
        })
    }

    /// What the exchange adds: the job and what it holds.
    fn cx(&self) -> Value {
        json!({
            "job_id": self.accepted.job_id,
            "bundle_id": self.accepted.bundle_id,
            "held_wei": self.accepted.held_wei.to_string(),
            "tier": self.accepted.tier,
        })
    }

    fn whole(&self, output: &Output) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": output.text},
                "finish_reason": output.finish_reason,
                "logprobs": null,
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": output.text,
                "finish_reason": output.finish_reason,
                "logprobs": null,
            }),
        };
        json!({
            "id": self.id(),
            "object": match self.kind { Kind::Chat => "chat.completion", Kind::Completion => "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": Self::usage(output),
            "cx": self.cx(),
        })
    }

    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut chunk = json!({
            "id": self.id(),
            "object": match self.kind { Kind::Chat => "chat.completion.chunk", Kind::Completion => "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }

    /// The stream's first event: the assistant's role (chat only).
    fn opening(&self) -> Option<Value> {
        (self.kind == Kind::Chat).then(|| {
            self.chunk(
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
                None,
            )
        })
    }

    /// A piece of the text.
    fn piece(&self, text: &str) -> Value {
        match self.kind {
            Kind::Chat => self.chunk(
                json!([{"index": 0, "delta": {"content": text}, "finish_reason": null}]),
                None,
            ),
            Kind::Completion => self.chunk(
                json!([{"index": 0, "text": text, "finish_reason": null}]),
                None,
            ),
        }
    }

    /// The finish, and the usage if asked for.
    fn closing(&self, output: &Output) -> Vec<Value> {
        let finish = match self.kind {
            Kind::Chat => json!([{"index": 0, "delta": {}, "finish_reason": output.finish_reason}]),
            Kind::Completion => {
                json!([{"index": 0, "text": "", "finish_reason": output.finish_reason}])
            }
        };
        let mut out = vec![self.chunk(finish, None)];
        if self.include_usage {
            out.push(self.chunk(json!([]), Some(Self::usage(output))));
        }
        out
    }
}

/// The SSE answer: keep-alives while the job runs, the provider's text piece by piece as it
/// streams it, then the rest of the signed result, the finish and `[DONE]` (or an `error`
/// event, as OpenAI's own streams end on one). `text` was subscribed before the job could run,
/// so no piece is missed; a piece out of order is skipped, and the signed result, which is what
/// is charged, fills the gap.
fn stream(
    state: AppState,
    reply: Reply,
    until: tokio::time::Instant,
    mut text: tokio::sync::broadcast::Receiver<crate::jobs::waiters::Progress>,
) -> Response {
    use tokio::sync::broadcast::error::RecvError;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let Ok(intake) = state.intake() else { return };
        let send = |event: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(Event::default().data(event.to_string())))
                    .await
                    .is_ok()
            }
        };
        if let Some(opening) = reply.opening()
            && !send(opening).await
        {
            return;
        }
        let done = outcome(intake, reply.accepted.job_id, until);
        tokio::pin!(done);
        let mut streamed = String::new();
        // Pieces are the provider's preview, relayed before any check. A job verified by
        // replicas gets no preview: the text is the buyer's only once the verdict makes it owe
        // for it, or a buyer could read it and stall its own replica until the job expires
        // unpaid.
        let mut pieces_open = reply.accepted.tier == Tier::T0;
        let result = loop {
            tokio::select! {
                result = &mut done => break result,
                piece = text.recv(), if pieces_open => match piece {
                    Ok(p) if p.offset == streamed.len() => {
                        streamed.push_str(&p.text);
                        if !send(reply.piece(&p.text)).await {
                            return;
                        }
                    }
                    Ok(_) | Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => pieces_open = false,
                },
            }
        };
        let events = match result {
            Ok(output) => match output.text.strip_prefix(streamed.as_str()) {
                Some(rest) => {
                    let mut events = Vec::new();
                    if !rest.is_empty() || streamed.is_empty() {
                        events.push(reply.piece(rest));
                    }
                    events.extend(reply.closing(&output));
                    events
                }
                None => vec![json!({"error": {
                    "code": "stream_mismatch",
                    "message": "the provider streamed text its signed result does not begin with; \
                                the result (GET /v1/jobs/{id}) is what was charged",
                }})],
            },
            Err(err) => vec![json!({"error": {
                "code": err.code(),
                "message": err.to_string(),
            }})],
        };
        for event in events {
            if !send(event).await {
                return;
            }
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}
