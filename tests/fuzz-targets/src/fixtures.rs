//! The fixed parties every target checks against: the exchange's domain and clock, an agent
//! (account key and the ML-DSA key bound to it), a provider, the committee's two ends, and a
//! tiny base model. Made once per process (ML-DSA key generation is the costly part).

use std::sync::OnceLock;

use cx_protocol::order::{self, Address, Eip712Domain, SigningKey};
use cx_protocol::pq::Identity;
use cx_protocol::pq::session::{M1_BYTES, M2_BYTES, M3_BYTES};
use cx_provider::model::{DType, GenModelOptions, ModelConfig, generated_config};
use cx_settlement::transport::Limits;

/// The exchange's clock when a target checks an order (unix seconds): the seeds' intents expire
/// at 1 500 with deadlines at 2 000.
pub(crate) const NOW_S: u64 = 1_000;

/// The largest adapter rank the provider accepts in [`crate::peft_adapter`].
pub(crate) const MAX_RANK: usize = 8;

pub(crate) struct Fixtures {
    /// The devnet chain's domain (chain 31337, Settlement at 0x5e5e…).
    pub(crate) domain: Eip712Domain,
    pub(crate) account_key: SigningKey,
    pub(crate) account: Address,
    /// The ML-DSA key bound to `account`.
    pub(crate) agent: Identity,
    /// The provider that signs receipts.
    pub(crate) provider: Identity,
    /// The committee's coordinator (handshake initiator) and a signer (responder).
    pub(crate) coordinator: Identity,
    pub(crate) signer: Identity,
    /// A base model of 2 layers, hidden 8: adapters are checked against it.
    pub(crate) base: ModelConfig,
}

pub(crate) fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let account_key = SigningKey::from_slice(&[7; 32]).expect("a valid secp256k1 scalar");
        Fixtures {
            domain: order::domain(31337, Address::repeat_byte(0x5e)),
            account: order::account_of(&account_key),
            account_key,
            agent: Identity::from_seed([9; 32]),
            provider: Identity::from_seed([11; 32]),
            coordinator: Identity::from_seed([13; 32]),
            signer: Identity::from_seed([15; 32]),
            base: generated_config(&GenModelOptions {
                hidden: 8,
                layers: 2,
                heads: 2,
                kv_heads: 1,
                intermediate: 16,
                vocab: 258,
                max_positions: 64,
                tie: true,
                dtype: DType::F32,
                seed: 1,
            })
            .expect("a valid generated config"),
        }
    })
}

/// The frame limits `Channel::accept` reads the handshake with (M1, then M3).
pub(crate) fn responder_limits() -> Limits {
    Limits {
        max_frame_bytes: M1_BYTES.max(M3_BYTES),
        ..Limits::default()
    }
}

/// The frame limits `Channel::connect` reads M2 with.
pub(crate) fn initiator_limits() -> Limits {
    Limits {
        max_frame_bytes: M2_BYTES,
        ..Limits::default()
    }
}

/// Runs `future` to completion on this thread's runtime (timers on: `read_frame` has deadlines).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
    }
    RUNTIME.with(|runtime| runtime.block_on(future))
}

/// Every frame `read_frame` takes from `bytes` as from a socket, in order, until it refuses
/// one (a short read or a length over `limits`).
pub(crate) fn frames(mut bytes: &[u8], limits: &Limits) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        match block_on(cx_settlement::transport::read_frame(&mut bytes, limits)) {
            Ok(frame) => out.push(frame),
            Err(_) => break,
        }
    }
    out
}
