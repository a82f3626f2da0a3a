//! The `matmul` job kind on the exchange ([`cx_protocol::matmul`]): the job a product intent
//! is cleared as, and the Freivalds check (tier T2, SPEC §7) a returned product must pass
//! before its job is `done`.
//!
//! The check regenerates `A` and `B` from the request's seeds and runs `k` batched Freivalds
//! rounds (`cx serve --freivalds-rounds`, default [`DEFAULT_FREIVALDS_ROUNDS`]: soundness 2⁻²⁰)
//! with vectors drawn from a fresh secret seed, so the provider cannot fit a wrong product to
//! them. Its cost is `2k·(m·k + k·n + m·n)` FLOPs against the product's `2·m·k·n`, which is what
//! the job event's `cost_fraction` records.

use super::{Placing, Produced, WorkloadOrder};
use crate::error::{Error, Result, invalid};
use crate::intake::state::Intake;
use crate::jobs::placement::{Placed, Want};
use alloy::primitives::{Address, B256};
use cx_protocol::matmul::{MATMUL_MODEL, MatmulRequest};
use cx_protocol::wire::{Assignment, Output};
use cx_protocol::{Job, Tier};
use serde::Serialize;

pub use cx_kernels::matmul::{DEFAULT_FREIVALDS_ROUNDS, MAX_FREIVALDS_ROUNDS};

/// Longest base64 text of a product: that of 4 MiB (2²⁰ `f32`s, the largest product allowed).
pub const MAX_PRODUCT_BASE64_BYTES: usize =
    (cx_protocol::matmul::MAX_MATMUL_ELEMENTS as usize * 4).div_ceil(3) * 4;

impl WorkloadOrder for MatmulRequest {
    const RETURNS: &'static [&'static str] = &["product"];
    /// The request and the product's bytes, for Freivalds' check.
    type Then = (MatmulRequest, Vec<u8>);

    /// Its bounds, the T2 tier it is always verified at, and the clearing over the bundles
    /// that offer the kernel (no stronger tier: none checks a product).
    async fn place(&self, intake: &Intake, want: &Want, placing: Placing) -> Result<Placed> {
        let job = job(want, self, placing.account, placing.now_s)?;
        intake.clear_placed(job, want, &[])
    }

    /// The product's bytes (present, base64, `4·m·n` of them), hashed.
    async fn produced(
        &self,
        _: &Intake,
        _: &Assignment,
        output: &Output,
    ) -> Result<Produced<Self::Then>> {
        let bytes = decode_product(output, self)?;
        Ok(Produced {
            output_hash: cx_protocol::matmul::product_hash(&bytes),
            hashed: "the product's bytes",
            tokens: 0,
            tokens_are: "output.prompt_tokens + output.completion_tokens",
            then: (*self, bytes),
        })
    }

    /// Freivalds' check: a product that fails ends the job `failed`, never charged, and is
    /// refused with [`Error::ProductRejected`]; the verdict of one that passes is recorded.
    async fn confirm(
        &self,
        intake: &Intake,
        job_id: B256,
        provider: &crate::books::Provider,
        (request, bytes): Self::Then,
        now_s: u64,
    ) -> Result<Option<serde_json::Value>> {
        let rounds = intake.freivalds_rounds();
        let verdict = check(request, bytes, rounds).await?;
        let detail = serde_json::to_value(&verdict)?;
        if !verdict.passed {
            intake
                .books()
                .fail_verification(job_id, provider.key_hash, now_s, &detail)
                .await?;
            intake.waiters().notify(job_id);
            return Err(Error::ProductRejected { rounds });
        }
        // Recorded with the result, in its transaction: the job may have left `running` while
        // the rounds ran, and then neither is kept.
        Ok(Some(detail))
    }
}

/// The bytes of a matmul job's returned product: present, base64, and exactly `4·m·n` bytes.
fn decode_product(output: &Output, request: &MatmulRequest) -> Result<Vec<u8>> {
    use base64::Engine as _;
    let invalid = |reason: String| Error::InvalidOutput {
        field: "product",
        reason,
    };
    let text = output.product.as_deref().ok_or_else(|| {
        invalid(
            "is missing: a cx/matmul-f32 job returns its product (f32 little-endian, base64)"
                .into(),
        )
    })?;
    if text.len() > MAX_PRODUCT_BASE64_BYTES {
        return Err(invalid(format!(
            "is longer than {MAX_PRODUCT_BASE64_BYTES} base64 characters"
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| invalid(format!("is not base64 (standard, padded): {e}")))?;
    if bytes.len() != request.product_bytes() {
        return Err(invalid(format!(
            "is {} bytes; C is {} × {} f32s, {} bytes",
            bytes.len(),
            request.m,
            request.n,
            request.product_bytes()
        )));
    }
    Ok(bytes)
}

/// The job a product intent is cleared as, at `now_s`: the `cx/matmul-f32` kernel market (only
/// bundles that list it among their resident bases take it), T2, `2·m·k·n` FLOPs, the operands
/// and product as the memory it needs. Refuses, by field, bounds past 2²⁰ elements, another
/// market, another tier, an adapter and a passed deadline.
pub fn job(want: &Want, request: &MatmulRequest, account: Address, now_s: u64) -> Result<Job> {
    request.validate().map_err(|e| e.within("matmul"))?;
    if want.model != MATMUL_MODEL {
        return Err(invalid(
            "want",
            format!("a matmul request is ordered in the {MATMUL_MODEL} market"),
        ));
    }
    if want.min_tier != Tier::T2 {
        return Err(invalid(
            "min_tier",
            "a product is verified by Freivalds' check: set min_tier to T2",
        ));
    }
    if want.adapter_id.is_some() {
        return Err(invalid("adapter_id", "a product takes no adapter"));
    }
    want.check_deadline(now_s)?;
    Ok(Job {
        agent: account.to_string(),
        base_model: MATMUL_MODEL.to_owned(),
        adapter: None,
        // Nothing is ever fetched (a bundle offering the kernel has it resident, no other is
        // feasible); a job's base must name some size, and one byte is the least.
        base_bytes: 1,
        adapter_bytes: 0,
        kv_bytes: request.working_bytes(),
        context_tokens: 1,
        deadline_s: (want.deadline_s - now_s) as f64,
        determinism: want.determinism,
        tier: Tier::T2,
        compute_flops: request.flops(),
        value_wei: want.max_price_wei,
        max_price_wei: Some(want.max_price_wei),
        // A product continues no conversation.
        prefix: None,
    })
}

/// What a check found, as the job event `verified` / `verification_failed` records it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// Always `T2`.
    pub tier: Tier,
    /// Always `freivalds`.
    pub method: &'static str,
    /// Every round passed.
    pub passed: bool,
    /// Rounds run (`k`).
    pub rounds: usize,
    /// Wall time of the check (operands regenerated and rounds run), milliseconds.
    pub check_ms: f64,
    /// The check's FLOPs over the product's.
    pub cost_fraction: f64,
}

/// Checks `product` (the returned bytes, `f32` little-endian) against `request` with `rounds`
/// Freivalds rounds, on a blocking thread. A product of the wrong length fails without a round.
pub async fn check(request: MatmulRequest, product: Vec<u8>, rounds: usize) -> Result<Verdict> {
    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).map_err(|e| Error::Verification(format!("no randomness: {e}")))?;
    let seed = u64::from_le_bytes(seed);
    tokio::task::spawn_blocking(move || check_now(&request, &product, rounds, seed))
        .await
        .map_err(|e| Error::Verification(format!("the Freivalds check panicked: {e}")))?
}

fn check_now(request: &MatmulRequest, product: &[u8], rounds: usize, seed: u64) -> Result<Verdict> {
    use cx_kernels::matmul::{check_flops, check_product, operands, product_flops};
    let started = std::time::Instant::now();
    let (m, k, n) = request.dims();
    let verdict = |passed: bool| Verdict {
        tier: Tier::T2,
        method: "freivalds",
        passed,
        rounds,
        check_ms: started.elapsed().as_secs_f64() * 1e3,
        cost_fraction: check_flops(m, k, n, rounds) / product_flops(m, k, n),
    };
    let Some(c) = cx_protocol::matmul::product_from_bytes(product).filter(|c| c.len() == m * n)
    else {
        return Ok(verdict(false));
    };
    let (a, b) = operands(m, k, n, request.seed_a, request.seed_b);
    let report = check_product(
        &a,
        &b,
        &c,
        m,
        k,
        n,
        rounds,
        seed,
        &cx_kernels::CpuConfig::default(),
    )
    .map_err(|e| Error::Verification(format!("the Freivalds check: {e}")))?;
    Ok(verdict(report.accepted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> MatmulRequest {
        MatmulRequest {
            m: 24,
            k: 40,
            n: 16,
            seed_a: 1,
            seed_b: 2,
        }
    }

    #[test]
    fn a_right_product_passes_and_a_wrong_one_fails() {
        let r = request();
        let (m, k, n) = r.dims();
        let (a, b) = cx_kernels::matmul::operands(m, k, n, r.seed_a, r.seed_b);
        let config = cx_kernels::CpuConfig::default();
        let mut c = cx_kernels::matmul::product(&a, &b, m, k, n, &config).unwrap();
        let good = check_now(&r, &cx_protocol::matmul::product_to_bytes(&c), 20, 9).unwrap();
        assert!(good.passed, "{good:?}");
        assert_eq!(good.rounds, 20);
        // 20·(24·40 + 40·16 + 24·16) / (24·40·16) = 39 680 / 15 360.
        assert!((good.cost_fraction - 2.0 * 20.0 * 1984.0 / (2.0 * 15_360.0)).abs() < 1e-12);
        cx_kernels::matmul::perturb(&mut c, k, n);
        let bad = check_now(&r, &cx_protocol::matmul::product_to_bytes(&c), 20, 9).unwrap();
        assert!(!bad.passed);
        // A truncated product fails without a round.
        assert!(!check_now(&r, &[0; 12], 20, 9).unwrap().passed);
    }
}
