//! What differs between the devnet's providers, so that the market has choices to make: asks,
//! cache sizes, bandwidths and batch sizes spread over the fleet.

/// What differs between providers: asks, threads, memory and bandwidth.
pub(super) struct Profile {
    pub(super) ask_wei_per_s: u64,
    pub(super) cache_bytes: u64,
    pub(super) bandwidth_bps: f64,
    pub(super) max_batch: u32,
    pub(super) stake_wei: u64,
    /// Its asks follow the market's quote (`--ask-follow`, its ask as the floor).
    pub(super) ask_follow: bool,
}

/// Provider `i`'s profile; `adapter_bytes` is what the devnet's adapters take together (their
/// size follows the model's shape), `None` for the generated model's.
pub(super) fn profile(i: u16, adapter_bytes: Option<u64>) -> Profile {
    let i = u64::from(i);
    // From room for a handful of adapters to room for all of them: the generated model's are
    // ~5 MB together; a real checkpoint's take their share of the same fractions.
    let cache_bytes = match adapter_bytes {
        None => [400_000, 1_500_000, 6_000_000][i as usize % 3],
        Some(total) => [total / 12, total * 3 / 10, total * 6 / 5][i as usize % 3].max(1),
    };
    Profile {
        // Close enough that residency (adapters in cache) decides as often as the ask does.
        ask_wei_per_s: 900_000 + 100_000 * (i % 4),
        cache_bytes,
        bandwidth_bps: [1e9, 2.5e8, 1e10][i as usize % 3],
        max_batch: [16, 32, 64][i as usize % 3],
        stake_wei: 1_000_000 * (i + 1),
        // Every third follows the quote: in calm markets it stays at its floor (its ask), in a
        // surge it asks more.
        ask_follow: i % 3 == 2,
    }
}
