//! The explorer (SPEC §11): pages of settled jobs, one job with its clearing decision, receipt,
//! verification and batch, batches, providers and markets, served beside the API.
