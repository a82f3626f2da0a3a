//! A job's path once its order is in: where it goes ([`placement`]; `replicas` for the T1
//! and T3 runs that re-execute it), how providers get it and report on it ([`dispatch`]), what
//! its result must pass before it is `done` ([`results`]), and who waits on it ([`waiters`]).
//! What a job of each kind asks and returns is its kind's ([`crate::orders`]); judging a
//! verification group is [`crate::verification`]'s.

pub mod dispatch;
pub mod placement;
pub(crate) mod replicas;
pub mod results;
pub mod waiters;
