//! Intent: submitted → cleared → dispatched → completed | failed | refunded.

use crate::error::{Error, Result};
use serde::Serialize;
use std::fmt;

/// Where an intent is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum IntentState {
    /// Accepted and escrowed, not yet matched.
    Submitted,
    /// Matched to a bundle.
    Cleared {
        /// The chosen bundle.
        bundle: String,
    },
    /// Sent to the provider.
    Dispatched {
        /// The bundle running it.
        bundle: String,
    },
    /// Result delivered before the deadline.
    Completed {
        /// The bundle that ran it.
        bundle: String,
        /// Hash of the output, as the receipt states it.
        output_hash: String,
    },
    /// The provider failed or defected; escrow goes back.
    Failed {
        /// Why.
        reason: String,
    },
    /// Escrow returned to the buyer.
    Refunded,
}

impl fmt::Display for IntentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Submitted => "submitted",
            Self::Cleared { .. } => "cleared",
            Self::Dispatched { .. } => "dispatched",
            Self::Completed { .. } => "completed",
            Self::Failed { .. } => "failed",
            Self::Refunded => "refunded",
        })
    }
}

/// An intent order: the buyer says what it wants; the exchange decides where.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Intent {
    /// Order id.
    pub id: String,
    /// Absolute deadline on the exchange clock, seconds.
    pub deadline_at_s: f64,
    /// Escrowed amount, wei.
    pub escrow_wei: u128,
    /// Current state.
    pub state: IntentState,
}

impl Intent {
    /// A freshly submitted intent.
    pub fn new(id: impl Into<String>, deadline_at_s: f64, escrow_wei: u128) -> Self {
        Self {
            id: id.into(),
            deadline_at_s,
            escrow_wei,
            state: IntentState::Submitted,
        }
    }

    fn refuse<T>(&self, event: &'static str) -> Result<T> {
        Err(Error::IllegalTransition {
            order: "intent",
            state: self.state.to_string(),
            event,
        })
    }

    /// Matched to `bundle`.
    pub fn clear(&mut self, bundle: &str) -> Result<()> {
        match self.state {
            IntentState::Submitted => {
                self.state = IntentState::Cleared {
                    bundle: bundle.to_owned(),
                };
                Ok(())
            }
            _ => self.refuse("clear"),
        }
    }

    /// Handed to the provider.
    pub fn dispatch(&mut self) -> Result<()> {
        match &self.state {
            IntentState::Cleared { bundle } => {
                self.state = IntentState::Dispatched {
                    bundle: bundle.clone(),
                };
                Ok(())
            }
            _ => self.refuse("dispatch"),
        }
    }

    /// The result came back at `now_s`. After the deadline it is too late: the timestamp alone
    /// decides, and the intent must be refunded instead.
    pub fn complete(&mut self, now_s: f64, output_hash: &str) -> Result<()> {
        match &self.state {
            IntentState::Dispatched { .. } if now_s > self.deadline_at_s => {
                self.refuse("complete after deadline")
            }
            IntentState::Dispatched { bundle } => {
                self.state = IntentState::Completed {
                    bundle: bundle.clone(),
                    output_hash: output_hash.to_owned(),
                };
                Ok(())
            }
            _ => self.refuse("complete"),
        }
    }

    /// The provider failed (or no bundle is feasible).
    pub fn fail(&mut self, reason: &str) -> Result<()> {
        match self.state {
            IntentState::Submitted
            | IntentState::Cleared { .. }
            | IntentState::Dispatched { .. } => {
                self.state = IntentState::Failed {
                    reason: reason.to_owned(),
                };
                Ok(())
            }
            _ => self.refuse("fail"),
        }
    }

    /// Returns the escrow: at once after a failure, otherwise only once the deadline has passed
    /// (automatic, on the timestamp, no adjudication). Returns the refunded amount.
    pub fn refund(&mut self, now_s: f64) -> Result<u128> {
        let allowed = match self.state {
            IntentState::Failed { .. } => true,
            IntentState::Submitted
            | IntentState::Cleared { .. }
            | IntentState::Dispatched { .. } => now_s > self.deadline_at_s,
            IntentState::Completed { .. } | IntentState::Refunded => false,
        };
        if !allowed {
            return self.refuse("refund");
        }
        self.state = IntentState::Refunded;
        Ok(self.escrow_wei)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn happy_path() {
        let mut i = Intent::new("i1", 10.0, 500);
        i.clear("b1").unwrap();
        i.dispatch().unwrap();
        i.complete(9.0, "abc").unwrap();
        assert!(matches!(i.state, IntentState::Completed { ref bundle, .. } if bundle == "b1"));
    }

    #[test]
    fn illegal_transitions_leave_state_unchanged() {
        let mut i = Intent::new("i1", 10.0, 500);
        let err = i.dispatch().unwrap_err();
        assert!(matches!(
            err,
            Error::IllegalTransition {
                event: "dispatch",
                ..
            }
        ));
        assert_eq!(i.state, IntentState::Submitted);
        i.clear("b1").unwrap();
        assert!(i.clear("b2").is_err());
        assert!(i.complete(1.0, "x").is_err());
        assert!(i.refund(5.0).is_err(), "no refund before the deadline");
        assert_eq!(
            i.state,
            IntentState::Cleared {
                bundle: "b1".into()
            }
        );
    }

    #[test]
    fn late_result_cannot_complete_and_deadline_refunds() {
        let mut i = Intent::new("i1", 10.0, 500);
        i.clear("b1").unwrap();
        i.dispatch().unwrap();
        assert!(i.complete(10.5, "x").is_err());
        assert_eq!(i.refund(10.5).unwrap(), 500);
        assert!(i.refund(11.0).is_err(), "refunded once");
    }

    #[test]
    fn failure_refunds_at_once_and_completed_never_refunds() {
        let mut i = Intent::new("i1", 10.0, 7);
        i.fail("provider defected").unwrap();
        assert_eq!(i.refund(1.0).unwrap(), 7);
        let mut done = Intent::new("i2", 10.0, 7);
        done.clear("b").unwrap();
        done.dispatch().unwrap();
        done.complete(2.0, "h").unwrap();
        assert!(done.refund(100.0).is_err());
        assert!(done.fail("late").is_err());
    }
}
