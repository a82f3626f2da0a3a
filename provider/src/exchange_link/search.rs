//! Searches (SPEC §3, Las Vegas work): the provider reads the exchange's open searches, looks
//! for a witness — a nonce with SHA-256(prefix ‖ nonce, 8 bytes little-endian) below the target
//! — on a blocking thread until the search's deadline, and claims the first it finds with a
//! signed receipt (job id and input: the search's digest; output: the witness's SHA-256; the
//! price the exchange set for the work a witness implies). The first valid witness at the
//! exchange wins; the others are refused. Its offer says how many trials a second it runs
//! ([`measure_trials_per_s`]): what the exchange prices searches' work at.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cx_protocol::DeterminismClass;
use cx_protocol::order::{B256, Search};
use cx_protocol::receipt::{Receipt, SignedReceipt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Link;
use crate::error::Result;

/// How often the open searches are read.
const POLL_EVERY: Duration = Duration::from_secs(2);
/// Trials between two looks at the clock (and at whether the search is still worth it).
const CHUNK: u64 = 1 << 16;

/// `GET /v1/providers/searches`.
#[derive(Debug, Deserialize)]
struct OpenSearches {
    searches: Vec<OpenSearch>,
}

/// One open search as the exchange lists it.
#[derive(Debug, Deserialize)]
struct OpenSearch {
    id: B256,
    account: cx_protocol::order::Address,
    chain_id: u64,
    escrow_id: u64,
    #[serde(with = "cx_protocol::price::wei_string")]
    held_wei: u128,
    ends_s: u64,
    order: serde_json::Value,
}

/// Trials per second of one search worker: the predicate (a SHA-256 of a 16-byte prefix and
/// the nonce) run for about 50 ms. Blocking.
pub(super) fn measure_trials_per_s() -> u64 {
    let search = Search {
        prefix: vec![0x5a; 16].into(),
        target: B256::repeat_byte(0),
        success_ppm: 500_000,
        deadline_s: 0,
        max_price_wei: 0,
        tab_id: 0,
        nonce: 0,
        expiry_s: 0,
    };
    let started = Instant::now();
    let mut trials = 0u64;
    while started.elapsed() < Duration::from_millis(50) {
        for n in trials..trials + 4_096 {
            std::hint::black_box(search.is_witness(n));
        }
        trials += 4_096;
    }
    (trials as f64 / started.elapsed().as_secs_f64()).max(1.0) as u64
}

/// What the exchange pays a witness of `search`, wei: the price it set when it accepted the
/// search (`order.price.witness_wei`), the work a witness implies.
fn witness_wei(search: &OpenSearch) -> Result<u128> {
    search
        .order
        .pointer("/price/witness_wei")
        .and_then(serde_json::Value::as_str)
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| crate::error::Error::Exchange("an open search without its price".into()))
}

/// `POST /v1/searches/{id}/witness`.
#[derive(Debug, Serialize)]
struct WitnessBody {
    witness: u64,
    receipt: SignedReceipt,
}

/// Reads open searches and works on each once, one at a time, until the process ends.
pub(super) async fn run(link: Arc<Link>) {
    let tried: Arc<Mutex<HashSet<B256>>> = Arc::default();
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        let open: Result<OpenSearches> = link
            .https
            .get_with_token(
                "/v1/providers/searches",
                link.token.as_str(),
                Duration::from_secs(20),
            )
            .await;
        let open = match open {
            Ok(open) => open,
            Err(e) => {
                tracing::warn!("reading open searches failed (retrying): {e}");
                continue;
            }
        };
        for search in open.searches {
            if !tried
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(search.id)
            {
                continue;
            }
            if let Err(e) = work(&link, &search).await {
                tracing::warn!("search {}: {e}", search.id);
            }
        }
    }
}

/// Looks for a witness of `search` until its deadline; claims it when found.
async fn work(link: &Arc<Link>, search: &OpenSearch) -> Result<()> {
    let signed: cx_protocol::order::Signed<Search> =
        serde_json::from_value(search.order.get("search").cloned().unwrap_or_default())
            .map_err(|e| crate::error::Error::Exchange(format!("an open search's order: {e}")))?;
    let order = signed.order;
    let owed = witness_wei(search)?;
    let until = Instant::now() + Duration::from_secs(search.ends_s.saturating_sub(link.now_s()));
    let started = Instant::now();
    let found = tokio::task::spawn_blocking(move || {
        let mut start = 0u64;
        while Instant::now() < until {
            if let Some(n) = (start..start + CHUNK).find(|n| order.is_witness(*n)) {
                return Some(n);
            }
            start += CHUNK;
        }
        None
    })
    .await
    .map_err(|e| crate::error::Error::Exchange(format!("search thread: {e}")))?;
    let Some(witness) = found else {
        tracing::info!("search {}: no witness by its deadline", search.id);
        return Ok(());
    };
    let receipt = Receipt {
        job_id: search.id.0,
        chain_id: search.chain_id,
        escrow_id: search.escrow_id,
        input_hash: search.id.0,
        output_hash: Sha256::digest(witness.to_le_bytes()).into(),
        adapter_hash: [0; 32],
        tokens: 0,
        compute_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        class: DeterminismClass::D,
        provider: link.config.payout.0.0,
        provider_key: link.identity.id().0,
        amount_owed_wei: owed,
        buyer: search.account.0.0,
    };
    let body = WitnessBody {
        witness,
        receipt: SignedReceipt::sign(receipt, &link.identity)?,
    };
    let _: serde_json::Value = link
        .https
        .post(
            &format!("/v1/searches/{}/witness", search.id),
            Some(link.token.as_str()),
            &body,
            Duration::from_secs(20),
        )
        .await?;
    tracing::info!(
        "search {}: witness {witness} accepted, {owed} wei (of {} held)",
        search.id,
        search.held_wei
    );
    Ok(())
}
