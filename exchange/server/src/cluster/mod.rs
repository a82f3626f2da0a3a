//! The exchange as a cluster of nodes on one database (ARCHITECTURE, "Past one machine").
//!
//! One node at a time writes the books: it holds the writer lease
//! ([`crate::books::Lease`], a PostgreSQL advisory lock plus an epoch that fences every
//! write committing a clearing or a fill), owns the matching engine and runs the sweeps. The
//! chain watchers and the settlement loop are duties with leases of their own, run by whichever
//! node holds them ([`Campaign`]), the writer or not. Every other node serves its port too: it forwards
//! each request to the writer ([`Forwarder`]), found in the lease's row, and waits as a standby
//! for the lease; when the writer dies, PostgreSQL drops its lock, one standby takes it, rebuilds
//! the engine from the books and swaps its router for the writer's without closing its port
//! ([`crate::service::Front`]), then advertises itself in the lease's row
//! ([`crate::books::Lease::advertise`]), and the others forward to it. So a load balancer may send any
//! request to any node, and a client sees a takeover as a few seconds of waiting (requests held
//! by the forwarding node until a writer answers) or, for a request the dying writer had taken,
//! a 502 that says it may have been done.
//!
//! Forwarded requests carry the client's address ([`FORWARDED_FOR`]) so the writer's per-address
//! limits count clients, not nodes; the writer believes it only beside the epoch's forwarding
//! token ([`FORWARD_TOKEN`]), which only a node that can read the database knows
//! ([`client_ip`]).

mod duties;
mod forward;
mod peer;

pub use duties::{Campaign, DUTY_PERIOD, DutyTask, Start, Stopped};
pub use forward::{Forwarder, PATIENCE};
pub use peer::{FORWARD_TOKEN, FORWARDED_FOR, client_ip};
