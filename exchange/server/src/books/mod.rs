//! The books: the exchange's durable state in PostgreSQL.
//!
//! The schema is the workspace's `migrations/` (embedded at build time, so building needs no
//! database), applied by [`Books::open`] when the server starts: a fresh machine gets its
//! database created and migrated, a running one only the migrations it lacks. Every state change
//! that must survive a crash is written here first; the matching engine's memory is a cache
//! rebuilt from these tables. This module is the one door to the database: handlers and loops ask
//! it, they never open connections of their own (the settlement coordinator's outbox gets this
//! pool, on the same migrated database).

mod accepts;
mod adapters;
mod bindings;
mod bundles;
mod chain;
mod content;
mod datasets;
mod fills;
mod jobs;
mod lease;
mod load;
mod meter;
mod preferences;
mod providers;
mod quotes;
mod reclear;
mod rent;
mod reserve;
mod residency;
mod search;
mod sessions;
mod settlement;
mod standing;
mod store;
mod tabs;
mod verification;
mod verified;

pub use adapters::StoredAdapter;
pub use bindings::StoredBinding;
pub use chain::{KEPT_BLOCKS, Rewind, SeenBatch, SeenBlock, TabEvent};
pub use content::{Content, DEFAULT_STORE_QUOTA_BYTES, Upload};
pub use cx_protocol::job_status::JobStatus;
pub use cx_protocol::wire::{JobEvent, JobRecord};
pub use datasets::DatasetSummary;
pub use fills::{RentFill, RentHolding, ReserveFill, StoredBid};
pub use jobs::{NewJob, NewOrder, NewRun};
pub use lease::{Duty, LEASE_PERIOD, LEASE_TIMEOUT, Lease, Seat, WriterAddress};
pub use load::OpenWork;
pub use meter::{METER_BATCH, Metered};
pub use providers::{JobResult, Provider};
pub use quotes::{MarketQuote, QUOTE_HISTORY_S, QuotePoint};
pub use reclear::{Reassigned, Stranded};
pub use rent::{CommittedRent, MISS_WINDOW_S, RentCommitment, pin_of};
pub use reserve::Drawable;
pub use residency::ResidencyMisses;
pub use sessions::Session;
pub use settlement::{PaidJob, SettledJob};
pub use standing::{StandingOrder, StandingTerms};
pub use store::{Books, DEFAULT_DATABASE_URL, MIGRATOR, database_url, redact_password};
pub use tabs::Tab;
pub use verification::{
    GroupHead, PendingSlash, RunRecord, SLASH_RETRY_FIRST_S, SLASH_RETRY_HORIZON_S,
    SLASH_RETRY_MAX_S, Verdict,
};
