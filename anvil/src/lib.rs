//! cx-devnet: Anvil chains, deployment, free ports, child processes (filled in by the move from cx-settlement).
