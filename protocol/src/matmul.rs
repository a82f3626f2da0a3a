//! The `matmul` job kind (SPEC §7, tier T2): a buyer orders the product `C = A·B` of two
//! operands that both sides generate from seeds, and the exchange checks the product a
//! provider returns with Freivalds' test instead of recomputing it.
//!
//! - **Market.** Intents for it name the reserved model [`MATMUL_MODEL`] (`cx/matmul-f32`) in
//!   `want`, at `min_tier` T2. Names under [`crate::job::KERNEL_MARKET_PREFIX`] (`cx/`) are job
//!   kinds the exchange itself defines, not catalog models: a bundle offers one by listing its
//!   name among its `resident_bases` (the kernel is always resident, nothing is ever fetched),
//!   and clearing refuses every other bundle by name.
//! - **Request.** [`MatmulRequest`] `{m, k, n, seed_a, seed_b}` is sent beside the signed intent
//!   (the `matmul` field of `POST /v1/intents`) and hashed into the intent's `request_hash` like
//!   an inference request: SHA-256 of its canonical JSON ([`MatmulRequest::hash`]).
//! - **Operands.** `A` (`m × k`) and `B` (`k × n`), row-major `f32`, each drawn uniform in
//!   `[−1, 1]` from ChaCha20 seeded with its seed (`cx_kernels::matmul::operands`, which the
//!   exchange and every provider call; this crate does no arithmetic).
//! - **Product.** `C` (`m × n`) travels as its `f32` little-endian bytes, base64 (standard
//!   alphabet, padded) in the result's `output.product`; the receipt's `output_hash` is SHA-256
//!   of the raw bytes, and its `tokens` is 0 (no tokens are involved).
//! - **Bounds.** `m, k, n ≥ 1` and each of `m·k`, `k·n`, `m·n` at most
//!   [`MAX_MATMUL_ELEMENTS`] (2²⁰), so no operand or product exceeds 4 MiB.
//!
//! ```
//! use cx_protocol::matmul::{MatmulRequest, MAX_MATMUL_ELEMENTS};
//!
//! let request = MatmulRequest { m: 512, k: 512, n: 512, seed_a: 1, seed_b: 2 };
//! request.validate().unwrap();
//! assert_eq!(request.flops(), 2.0 * 512f64.powi(3));
//! assert_eq!(request.product_bytes(), 512 * 512 * 4);
//! let wide = MatmulRequest { n: MAX_MATMUL_ELEMENTS as u32 + 1, ..request };
//! assert_eq!(wide.validate().unwrap_err().field(), "n");
//! ```

use crate::error::{Error, Result};
use crate::order::B256;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The reserved market of `f32` matrix products (a job kind, not a catalog model).
pub const MATMUL_MODEL: &str = "cx/matmul-f32";

/// Most elements of each operand and of the product (2²⁰: 4 MiB of `f32`).
pub const MAX_MATMUL_ELEMENTS: u64 = 1 << 20;

/// A product `C = A·B` to compute: the shapes and the operands' seeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MatmulRequest {
    /// Rows of `A` and of `C`.
    pub m: u32,
    /// Columns of `A`, rows of `B` (the reduction length).
    pub k: u32,
    /// Columns of `B` and of `C`.
    pub n: u32,
    /// Seed of `A`'s generator.
    pub seed_a: u64,
    /// Seed of `B`'s generator.
    pub seed_b: u64,
}

impl MatmulRequest {
    /// Checks the bounds; the error names the field to change (`m`, `k` or `n`).
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [("m", self.m), ("k", self.k), ("n", self.n)] {
            if value == 0 {
                return Err(Error::InvalidField {
                    field: field.to_owned(),
                    reason: "must be at least 1".to_owned(),
                });
            }
        }
        let (m, k, n) = (u64::from(self.m), u64::from(self.k), u64::from(self.n));
        // Each pair names the field whose growth past the bound is the one to undo: the later
        // dimension of the pair, so that a too-wide `n` is blamed on `n`.
        for (what, elements, field) in [("A (m·k)", m * k, "k"), ("B (k·n)", k * n, "n")] {
            if elements > MAX_MATMUL_ELEMENTS {
                return Err(too_large(field, what, elements));
            }
        }
        if m * n > MAX_MATMUL_ELEMENTS {
            return Err(too_large("m", "C (m·n)", m * n));
        }
        Ok(())
    }

    /// `(m, k, n)` as sizes.
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.m as usize, self.k as usize, self.n as usize)
    }

    /// The product's work: `2·m·k·n` floating-point operations.
    pub fn flops(&self) -> f64 {
        2.0 * f64::from(self.m) * f64::from(self.k) * f64::from(self.n)
    }

    /// Bytes of the product as it travels (`4·m·n`).
    pub fn product_bytes(&self) -> usize {
        self.m as usize * self.n as usize * 4
    }

    /// Bytes of both operands and the product, `4·(m·k + k·n + m·n)`: what a bundle must hold.
    pub fn working_bytes(&self) -> u64 {
        let (m, k, n) = (u64::from(self.m), u64::from(self.k), u64::from(self.n));
        4 * (m * k + k * n + m * n)
    }

    /// The intent's `request_hash`: SHA-256 of the request's canonical JSON (keys sorted, no
    /// whitespace), the same rule as an inference request's.
    pub fn hash(&self) -> B256 {
        crate::order::request_value_hash(
            &serde_json::to_value(self).expect("a matmul request always serializes"),
        )
    }
}

fn too_large(field: &str, what: &str, elements: u64) -> Error {
    Error::InvalidField {
        field: field.to_owned(),
        reason: format!(
            "makes {what} {elements} elements, over the limit of {MAX_MATMUL_ELEMENTS} (2^20)"
        ),
    }
}

/// The product's bytes, `f32` little-endian, from its entries.
pub fn product_to_bytes(c: &[f32]) -> Vec<u8> {
    c.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The product's entries from its bytes; `None` unless the length is a whole number of `f32`s.
pub fn product_from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// SHA-256 of the product's bytes: the receipt's `output_hash` of a matmul job.
pub fn product_hash(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> MatmulRequest {
        MatmulRequest {
            m: 4,
            k: 3,
            n: 2,
            seed_a: 7,
            seed_b: 18_446_744_073_709_551_615,
        }
    }

    #[test]
    fn the_hash_is_sha256_of_sorted_compact_json() {
        let text = r#"{"k":3,"m":4,"n":2,"seed_a":7,"seed_b":18446744073709551615}"#;
        assert_eq!(
            crate::order::canonical_json(&serde_json::to_value(request()).unwrap()),
            text
        );
        assert_eq!(
            request().hash(),
            B256::from(<[u8; 32]>::from(Sha256::digest(text.as_bytes())))
        );
        // Any field changes the hash: the intent commits to the shapes and both seeds.
        let other = MatmulRequest {
            seed_b: 8,
            ..request()
        };
        assert_ne!(other.hash(), request().hash());
    }

    #[test]
    fn bounds_are_refused_by_field_name() {
        request().validate().unwrap();
        for (field, bad) in [
            ("m", MatmulRequest { m: 0, ..request() }),
            ("k", MatmulRequest { k: 0, ..request() }),
            ("n", MatmulRequest { n: 0, ..request() }),
            (
                "k",
                MatmulRequest {
                    m: 1,
                    k: (1 << 20) + 1,
                    n: 1,
                    ..request()
                },
            ),
            (
                "n",
                MatmulRequest {
                    m: 1,
                    k: 2,
                    n: 1 << 20,
                    ..request()
                },
            ),
            (
                "m",
                MatmulRequest {
                    m: 1 << 11,
                    k: 1,
                    n: 1 << 10,
                    ..request()
                },
            ),
        ] {
            let err = bad.validate().unwrap_err();
            assert_eq!(err.field(), field, "{bad:?}: {err}");
        }
        // The largest allowed shapes pass: every operand exactly 2^20 elements.
        MatmulRequest {
            m: 1 << 10,
            k: 1 << 10,
            n: 1 << 10,
            ..request()
        }
        .validate()
        .unwrap();
        MatmulRequest {
            m: 1,
            k: 1 << 20,
            n: 1,
            ..request()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = serde_json::from_str::<MatmulRequest>(
            r#"{"m":1,"k":1,"n":1,"seed_a":1,"seed_b":2,"transpose":true}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("transpose"), "{err}");
    }

    #[test]
    fn product_bytes_round_trip_little_endian() {
        let c = [1.0f32, -2.5, f32::MIN_POSITIVE];
        let bytes = product_to_bytes(&c);
        assert_eq!(&bytes[..4], &1.0f32.to_le_bytes());
        assert_eq!(product_from_bytes(&bytes).unwrap(), c);
        assert!(product_from_bytes(&bytes[..5]).is_none());
    }
}
