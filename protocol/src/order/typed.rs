//! The EIP-712 side of every signed order: the structs as a wallet sees them (camelCase, Solidity
//! types), declared once with alloy's `sol!` so that `encodeType`, `hashStruct` and the signing
//! hash come from alloy's `SolStruct` and are never written by hand.
//!
//! Integer widths are chosen for what the value is: `uint256` for money in wei (the escrow's
//! unit on chain), `uint64` for unix seconds, ids and nonces, `uint8` for enums (tiers, classes,
//! rent targets), `uint32` for parts per million. The Rust side ([`super::kinds`]) holds the same
//! data with units in its names and typed enums; each kind converts both ways.

#![allow(missing_docs)] // the fields are documented on the Rust-side types in `kinds`

alloy_sol_types::sol! {
    /// An intent: what the buyer wants, within a price limit and a deadline (SPEC §3).
    #[derive(Debug, PartialEq, Eq)]
    struct Intent {
        string want;
        bytes32 adapterId;
        bytes32 requestHash;
        uint64 deadline;
        uint256 maxPriceWei;
        bool marketLimit;
        uint8 minTier;
        uint8 determinism;
        uint64 tab;
        uint64 nonce;
        uint64 expiry;
    }

    /// Reserved capacity over a time window, take-or-pay.
    #[derive(Debug, PartialEq, Eq)]
    struct Reserve {
        string model;
        uint8 tier;
        uint64 windowStart;
        uint64 windowEnd;
        uint64 computeMs;
        uint256 maxPriceWeiPerS;
        uint64 tab;
        uint64 nonce;
        uint64 expiry;
    }

    /// Rent on state: keep an adapter, a base or a prefix resident over a term.
    #[derive(Debug, PartialEq, Eq)]
    struct Rent {
        uint8 targetKind;
        bytes32 target;
        uint64 termSeconds;
        uint256 maxRentWei;
        uint32 epsilonPpm;
        uint64 tab;
        uint64 nonce;
        uint64 expiry;
    }

    /// Las Vegas work: a witness `nonce` with SHA-256(prefix ‖ nonce) < target.
    #[derive(Debug, PartialEq, Eq)]
    struct Search {
        bytes prefix;
        bytes32 target;
        uint32 successPpm;
        uint64 deadline;
        uint256 maxPriceWei;
        uint64 tab;
        uint64 nonce;
        uint64 expiry;
    }

    /// The terms a tab's on-chain `ref` commits to.
    #[derive(Debug, PartialEq, Eq)]
    struct TabTerms {
        address buyer;
        uint256 amountWei;
        uint64 deadline;
        uint64 nonce;
    }

    /// A session key: a bearer secret allowed to spend from a tab within a cap.
    #[derive(Debug, PartialEq, Eq)]
    struct SessionGrant {
        uint64 tab;
        uint256 spendCapWei;
        uint64 expiry;
        uint64 defaultDeadlineS;
        uint8 defaultTier;
        uint8 defaultDeterminism;
        uint256 defaultMaxPriceWei;
        bytes32 bearerHash;
        uint64 nonce;
    }

    /// The account's half of an ML-DSA key binding.
    #[derive(Debug, PartialEq, Eq)]
    struct PqBinding {
        address account;
        bytes32 mldsaKeyHash;
        uint64 nonce;
    }
}
