//! cx-contracts: typed bindings of the contracts (filled in by the move from cx-settlement).
