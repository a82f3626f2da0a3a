//! A job's lifecycle state, as the exchange's API reports it and `exchange_jobs.status` holds it
//! (the column's CHECK allows exactly these names: migration `exchange_job_status_check`).
//!
//! ```text
//! assigned ──taken──▶ running ──result──▶ done                 (unreplicated: paid)
//!    │                   │       └──────▶ verifying ──▶ done   (its run agreed with the majority)
//!    │                   │                    └───────▶ failed (outvoted)
//!    ├──▶ cancelled (by the buyer, before a provider took it)
//!    └──▶ expired / refunded / failed (deadline passed, bundle withdrawn, result refused)
//! ```
//!
//! Settled is not a job state: a job is settled when the batch that pays it is posted on chain
//! (the explorer shows it so, from the batch).

use serde::{Deserialize, Serialize};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// `type_name = "text"`: the column is TEXT with a CHECK, not a PostgreSQL enum type, so the
// derive must not name a type of its own (sqlx would then expect a type called `JobStatus`).
#[cfg_attr(
    feature = "sqlx",
    derive(sqlx::Type),
    sqlx(type_name = "text", rename_all = "snake_case")
)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Cleared onto a bundle, waiting for its provider to take it.
    Assigned,
    /// Taken by its provider.
    Running,
    /// A replicated run's result is in; the group's verdict is pending.
    Verifying,
    /// Its result stands: the buyer owes for it.
    Done,
    /// No result (or no verified result) by the deadline: its hold went back, nothing charged.
    Expired,
    /// Cancelled by its buyer before a provider took it.
    Cancelled,
    /// Its bundle went away or its group ended without it: the hold went back.
    Refunded,
    /// Its result was refused or outvoted.
    Failed,
}

impl JobStatus {
    /// Every state, in lifecycle order.
    pub const ALL: [JobStatus; 8] = [
        JobStatus::Assigned,
        JobStatus::Running,
        JobStatus::Verifying,
        JobStatus::Done,
        JobStatus::Expired,
        JobStatus::Cancelled,
        JobStatus::Refunded,
        JobStatus::Failed,
    ];

    /// The name the column and the API use.
    pub const fn as_str(self) -> &'static str {
        match self {
            JobStatus::Assigned => "assigned",
            JobStatus::Running => "running",
            JobStatus::Verifying => "verifying",
            JobStatus::Done => "done",
            JobStatus::Expired => "expired",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Refunded => "refunded",
            JobStatus::Failed => "failed",
        }
    }

    /// Whether nothing more happens to the job (its hold is charged or released for good).
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Done
                | JobStatus::Expired
                | JobStatus::Cancelled
                | JobStatus::Refunded
                | JobStatus::Failed
        )
    }

    /// Whether a provider still owes work on it (cleared, not yet returned).
    pub const fn is_open(self) -> bool {
        matches!(self, JobStatus::Assigned | JobStatus::Running)
    }

    /// Whether it still holds money on its tab awaiting an outcome: open, or a result that
    /// waits for its group's verdict.
    pub const fn is_pending(self) -> bool {
        self.is_open() || matches!(self, JobStatus::Verifying)
    }
}

impl std::str::FromStr for JobStatus {
    type Err = UnknownJobStatus;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        JobStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| UnknownJobStatus(name.to_owned()))
    }
}

/// A state compares with its name (`job.status == "done"`), as a client reading the API would
/// compare the text.
impl PartialEq<&str> for JobStatus {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

/// A status name that is none of [`JobStatus`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown job status `{0}`")]
pub struct UnknownJobStatus(pub String);

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serde_names_and_each_state_is_open_pending_or_terminal() {
        for status in JobStatus::ALL {
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::String(status.as_str().into())
            );
            assert_eq!(
                serde_json::from_value::<JobStatus>(status.as_str().into()).unwrap(),
                status
            );
            assert_eq!(status.as_str().parse::<JobStatus>(), Ok(status));
            assert_ne!(status.is_pending(), status.is_terminal(), "{status}");
        }
        assert!(serde_json::from_value::<JobStatus>("settled".into()).is_err());
        assert!("settled".parse::<JobStatus>().is_err());
    }
}
