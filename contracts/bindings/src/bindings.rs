//! The `sol!` expansions, one module per contract: every artifact declares the shared library
//! struct `FrostVerifier.Signature`, so they cannot share a namespace.
//!
//! The generated items carry no doc comments of their own (the contracts' NatSpec is in
//! `contracts/src/`), hence the `missing_docs` allowance on this module alone.

/// `Settlement` (escrow, batches, group key).
pub mod settlement {
    alloy::sol!(
        #[sol(rpc)]
        #[derive(Debug, PartialEq, Eq)]
        Settlement,
        "../artifacts/Settlement.json"
    );
}

/// `ProviderRegistry` (stake, unbonding, slashing, metadata).
pub mod registry {
    alloy::sol!(
        #[sol(rpc)]
        #[derive(Debug, PartialEq, Eq)]
        ProviderRegistry,
        "../artifacts/ProviderRegistry.json"
    );
}

/// `TestStablecoin` (the devnet's ERC-20).
pub mod stablecoin {
    alloy::sol!(
        #[sol(rpc)]
        #[derive(Debug, PartialEq, Eq)]
        TestStablecoin,
        "../artifacts/TestStablecoin.json"
    );
}

/// `FrostGasProbe` (gas of one verification, for the bench).
pub mod probe {
    alloy::sol!(
        #[sol(rpc)]
        #[derive(Debug, PartialEq, Eq)]
        FrostGasProbe,
        "../artifacts/FrostGasProbe.json"
    );
}
