//! The chain watcher: follows every chain of the registry (tabs opened and reclaimed on
//! `Escrow`, stakes on `ProviderRegistry`, batches accepted by `Settlement`) and writes what it
//! saw to the books, so that the exchange never trusts a tab or a stake it has not read on chain.
