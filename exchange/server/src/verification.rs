//! Verification by tier (SPEC §7): T0 stake only, T1 byte equality on a second provider, T2
//! Freivalds spot checks (`cx-kernels`), T3 diverse majority. A receipt is paid only after its
//! tier's check has passed.
