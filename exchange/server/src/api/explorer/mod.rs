//! The explorer (SPEC §11): server-rendered pages of the market, served by the exchange beside
//! its API — jobs (filterable, paged), one job with its order, clearing decision, assignment,
//! receipt, verification and settlement batch, batches, providers, markets and accounts.
//!
//! - [`routes`] mounts the pages under `/explorer`; each handler checks its input
//!   ([`params`]), reads the books ([`queries`], read-only SQL), and answers with the page's
//!   data either as HTML ([`pages`], maud templates built from [`html`]'s blocks inside [`layout`]'s
//!   document, charts from [`svg`], values formatted by [`format`]) or, when the request's
//!   `Accept` names `application/json`, as that same data in JSON. Errors follow the same rule:
//!   our JSON error shape, or an HTML page with the same status and message.
//! - No script and no build step: inline CSS, charts as inline SVG, links between every page
//!   (job → batch, job → provider, batch → jobs, provider → jobs, account → jobs). Elements a
//!   browser test looks for carry stable ids (`#status`, `#cost-terms`, `#tx-<chain id>`, …).
//! - Transaction hashes link to a chain's block explorer (EIP-3091 `{url}/tx/{hash}`) when the
//!   state was given one for that chain ([`AppState::with_chain_explorers`]).

mod format;
mod html;
mod layout;
mod pages;
mod params;
mod queries;
mod svg;

use super::error::ApiError;
use super::state::AppState;
use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use maud::Markup;
use params::{Before, JobsQuery, ListQuery};
use serde::Serialize;

/// How long a provider page waits for a chain to say what the provider has at stake.
const STAKE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The explorer's routes, to merge into the exchange's router (they share its [`AppState`]).
pub fn routes() -> Router<AppState> {
    book_routes()
        .route("/explorer/providers/{key_hash}", get(provider))
        .route("/explorer/markets", get(markets))
        .route("/explorer/accounts/{address}", get(account))
        .route("/explorer/{*rest}", get(unknown))
}

/// The pages read from the books alone — no matching engine, no chain — which any node with a
/// connection to the database serves itself ([`AppState::reading`]): the writer's engine holds
/// the rest (live bundles, quotes, preferences).
pub fn book_routes() -> Router<AppState> {
    Router::new()
        .route("/explorer", get(index))
        .route("/explorer/", get(index))
        .route("/explorer/jobs", get(jobs))
        .route("/explorer/jobs/{id}", get(job))
        .route("/explorer/batches", get(batches))
        .route("/explorer/batches/{id}", get(batch))
        .route("/explorer/providers", get(providers))
        .route("/explorer/accounts", get(accounts))
}

/// How a request wants its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Html,
    Json,
}

impl Format {
    /// JSON when `Accept` names `application/json` (a browser's `Accept` does not), else HTML.
    fn of(headers: &HeaderMap) -> Self {
        let json = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|m| {
                m.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
        if json { Self::Json } else { Self::Html }
    }
}

/// The page's data as JSON or as the HTML `render` makes of it; an error as our JSON error or an
/// HTML error page with the same status.
fn respond<T: Serialize>(
    format: Format,
    result: Result<T, ApiError>,
    render: impl FnOnce(&T) -> Markup,
) -> Response {
    let mut response = match (result, format) {
        (Ok(data), Format::Json) => axum::Json(data).into_response(),
        (Ok(data), Format::Html) => html_response(StatusCode::OK, render(&data)),
        (Err(err), Format::Json) => err.into_response(),
        (Err(err), Format::Html) => {
            if let ApiError::Internal(cause) = &err {
                tracing::error!(error = %cause, "an explorer page failed inside the server");
            }
            let status = err.status();
            let page = pages::error_page(status, err.code(), &err.to_string());
            html_response(status, page)
        }
    };
    // The same URL answers in two formats: caches must key on Accept.
    response
        .headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept"));
    response
}

/// The pages run no script and load nothing: a policy that says so makes inert any markup that
/// got past the templates' escaping, whatever it is.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

// maud's own `axum` feature would answer a `Markup` directly; the page goes through axum's
// `Html` instead, so that the status and the security policy are set here in one place.
fn html_response(status: StatusCode, page: Markup) -> Response {
    let mut response = (status, axum::response::Html(page.into_string())).into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

fn bad_query(err: QueryRejection) -> ApiError {
    ApiError::Invalid {
        field: None,
        message: err.body_text(),
    }
}

fn not_found(what: &str) -> ApiError {
    ApiError::NotFound {
        what: what.to_owned(),
    }
}

async fn index(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let result = async {
        let pool = state.books()?.pool();
        let statuses = queries::jobs::status_counts(pool).await?;
        let recent = queries::jobs::list(
            pool,
            &params::JobFilter::default(),
            params::Paging { limit: 10, page: 1 },
            Before::Start,
        )
        .await?;
        let (batches, _) =
            queries::settlement::list(pool, params::Paging { limit: 5, page: 1 }, Before::Start)
                .await?;
        Ok::<_, ApiError>(pages::index::IndexPage {
            statuses: statuses
                .into_iter()
                .map(|(status, jobs)| pages::index::StatusCount { status, jobs })
                .collect(),
            recent_jobs: recent.jobs,
            recent_batches: batches,
        })
    }
    .await;
    respond(Format::of(&headers), result, pages::index::render)
}

async fn jobs(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let Query(query) = query.map_err(bad_query)?;
        let (filter, paging, before) = query.check()?;
        let pool = state.books()?.pool();
        if let Before::After(id) = before
            && !queries::jobs::exists(pool, id).await?
        {
            return Err(ApiError::invalid(
                "before",
                "no such job: a cursor names a job",
            ));
        }
        let list = queries::jobs::list(pool, &filter, paging, before).await?;
        Ok(pages::jobs::JobsPage::new(filter, paging, before, list))
    }
    .await;
    respond(Format::of(&headers), result, pages::jobs::render)
}

async fn job(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let id = params::job_id("id", &id)?;
        let pool = state.books()?.pool();
        let job = queries::jobs::detail(pool, id)
            .await?
            .ok_or_else(|| not_found("job"))?;
        Ok(pages::job::JobPage::new(job, state.explorer()))
    }
    .await;
    respond(Format::of(&headers), result, pages::job::render)
}

async fn batches(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let Query(query) = query.map_err(bad_query)?;
        let (paging, before) = query.check_numeric()?;
        let pool = state.books()?.pool();
        let (batches, more) = queries::settlement::list(pool, paging, before).await?;
        Ok(pages::batches::BatchesPage::new(
            batches,
            more,
            paging,
            state.explorer(),
        ))
    }
    .await;
    respond(Format::of(&headers), result, pages::batches::render_list)
}

async fn batch(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let result = async {
        let id = params::batch_id(&id)?;
        let pool = state.books()?.pool();
        let batch = queries::settlement::detail(pool, id)
            .await?
            .ok_or_else(|| not_found("batch"))?;
        Ok(pages::batches::BatchPage::new(batch, state.explorer()))
    }
    .await;
    respond(Format::of(&headers), result, pages::batches::render_one)
}

async fn providers(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let Query(query) = query.map_err(bad_query)?;
        let paging = query.check_paged()?;
        let pool = state.books()?.pool();
        let (providers, more) = queries::providers::list(pool, paging).await?;
        Ok(pages::providers::ProvidersPage {
            providers,
            page: paging.page,
            more,
        })
    }
    .await;
    respond(Format::of(&headers), result, pages::providers::render_list)
}

async fn provider(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(key_hash): Path<String>,
) -> Response {
    let result = async {
        let key_hash = params::key_hash("key_hash", &key_hash)?;
        let intake = state.intake()?;
        let live: std::collections::HashSet<String> = intake
            .market()
            .bundles()
            .into_iter()
            .map(|b| b.id)
            .collect();
        let mut provider =
            queries::providers::detail(intake.books().pool(), key_hash, |id| live.contains(id))
                .await?
                .ok_or_else(|| not_found("provider"))?;
        provider.residency_misses = intake.books().residency_misses(key_hash).await?;
        // The stake is on chain: read it now, each chain given a moment at most.
        if let Ok(payout) = provider.summary.payout.parse() {
            provider.stakes = intake
                .registries()
                .stakes(payout, STAKE_READ_TIMEOUT)
                .await
                .into_iter()
                .map(|(chain_id, staked)| queries::providers::StakeView {
                    chain_id,
                    staked_wei: staked.to_string(),
                })
                .collect();
        }
        Ok(provider)
    }
    .await;
    respond(Format::of(&headers), result, pages::providers::render_one)
}

async fn markets(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let result = async {
        let intake = state.intake()?;
        let quotes = intake.market().quotes()?;
        let quote_history = intake
            .books()
            .quote_history(queries::markets::POINTS * 4)
            .await?;
        let history = queries::markets::history(intake.books().pool()).await?;
        Ok::<_, ApiError>(pages::markets::MarketsPage {
            quotes,
            quote_history,
            history,
        })
    }
    .await;
    respond(Format::of(&headers), result, pages::markets::render)
}

async fn accounts(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let Query(query) = query.map_err(bad_query)?;
        let paging = query.check_paged()?;
        let pool = state.books()?.pool();
        let (accounts, more) = queries::accounts::list(pool, paging).await?;
        Ok(pages::accounts::AccountsPage {
            accounts,
            page: paging.page,
            more,
        })
    }
    .await;
    respond(Format::of(&headers), result, pages::accounts::render_list)
}

async fn account(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(address): Path<String>,
) -> Response {
    let result = async {
        let account = params::account(&address)?;
        let intake = state.intake()?;
        let mut detail = queries::accounts::detail(intake.books().pool(), account)
            .await?
            .ok_or_else(|| not_found("account"))?;
        detail.preference = intake.market().preference_of(account);
        Ok(detail)
    }
    .await;
    respond(Format::of(&headers), result, pages::accounts::render_one)
}

async fn unknown(headers: HeaderMap) -> Response {
    respond::<()>(
        Format::of(&headers),
        Err(not_found("explorer page")),
        |_| maud::html! {},
    )
}
