//! A buyer's request that the exchange settle a tab now: the tab takes no more jobs, and the
//! next batch pays what its jobs were charged and returns the rest to the buyer.
//!
//! It is signed with the ML-DSA-65 key bound to the buyer's account (FIPS 204 context
//! `cx-tab-close-v1`) over a fixed-width encoding that names the chain, its Settlement contract
//! and the escrow, so it closes that tab and no other:
//!
//! ```text
//! "CXC1" ‖ chain_id u64 ‖ settlement 20 ‖ escrow_id u64
//! ```
//!
//! A replay closes a tab that is already closing: closing only ever settles sooner, in the
//! buyer's favour, so no nonce is needed.
//!
//! ```
//! use cx_protocol::pq::Identity;
//! use cx_protocol::tab_close::{TAB_CLOSE_CONTEXT, tab_close_message};
//! use alloy_primitives::Address;
//!
//! let buyer = Identity::from_seed([3; 32]);
//! let message = tab_close_message(31337, Address::repeat_byte(0xcc), 4);
//! let signature = buyer.sign(TAB_CLOSE_CONTEXT, &message).unwrap();
//! buyer.public().verify(TAB_CLOSE_CONTEXT, &message, &signature).unwrap();
//! let other = tab_close_message(31337, Address::repeat_byte(0xcc), 5);
//! assert!(buyer.public().verify(TAB_CLOSE_CONTEXT, &other, &signature).is_err());
//! ```

use alloy_primitives::Address;

/// FIPS 204 context of tab-close signatures.
pub const TAB_CLOSE_CONTEXT: &[u8] = b"cx-tab-close-v1";

/// Bytes of [`tab_close_message`].
pub const TAB_CLOSE_BYTES: usize = 4 + 8 + 20 + 8;

/// The bytes a buyer signs to close tab `escrow_id` of `settlement` on `chain_id`.
pub fn tab_close_message(
    chain_id: u64,
    settlement: Address,
    escrow_id: u64,
) -> [u8; TAB_CLOSE_BYTES] {
    let mut out = [0u8; TAB_CLOSE_BYTES];
    out[..4].copy_from_slice(b"CXC1");
    out[4..12].copy_from_slice(&chain_id.to_be_bytes());
    out[12..32].copy_from_slice(settlement.as_slice());
    out[32..].copy_from_slice(&escrow_id.to_be_bytes());
    out
}
