//! A leader per duty: the settlement loop and the chain watchers run once per cluster, on
//! whichever node holds each duty's lease ([`crate::books::Seat::Duty`]), writer or standby.
//! Every node started for a duty campaigns for it ([`Campaign::start`]): it waits on the lease,
//! and while it holds it runs the duty over books fenced by the lease's epoch; when the lease is
//! lost (another node cut off a hung holder, the database lost the lock) the duty stops after its
//! pass and the node waits for the lease again. A node that dies loses its locks when its socket
//! closes, and the next node waiting takes the duty within a [`LEASE_PERIOD`] (a hung one: within
//! [`crate::books::LEASE_TIMEOUT`]). Each duty starts from the books where the last holder left
//! them — the settlement outbox and the chains' cursors are in PostgreSQL — so a takeover loses
//! nothing and, the epoch fencing the old holder's late writes, does nothing twice.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::books::{Books, Duty, LEASE_PERIOD, Lease, Seat};
use crate::error::Result;

/// How often a chain watcher polls its chain and the settlement loop makes a pass.
pub const DUTY_PERIOD: Duration = Duration::from_secs(1);

/// One of a duty's loops, running until the future it was given resolves.
pub type DutyTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Resolves when the duty must stop (its lease lost, the node stopping).
pub type Stopped = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a duty runs, built over books fenced by its lease: one task per loop (a watcher per
/// chain, the settlement loop), each given a [`Stopped`] of its own.
pub type Start = Box<dyn Fn(Books, &dyn Fn() -> Stopped) -> Result<Vec<DutyTask>> + Send + Sync>;

/// The node's campaigns, one per duty it is ready to run.
#[derive(Debug)]
pub struct Campaign {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Campaign {
    /// Campaigns for each duty of `duties` on `database_url` as `holder` (a name for people), and
    /// runs it while the lease is held.
    pub fn start(database_url: &str, holder: &str, duties: Vec<(Duty, Start)>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let tasks = duties
            .into_iter()
            .map(|(duty, start)| {
                tokio::spawn(hold(
                    database_url.to_owned(),
                    duty,
                    holder.to_owned(),
                    start,
                    stopped.clone(),
                ))
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops campaigning; a duty held lets its loops finish their pass, then gives its lease up.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Takes `duty`'s lease whenever it can and runs it while held, until `stopped`.
async fn hold(
    database_url: String,
    duty: Duty,
    holder: String,
    start: Start,
    mut stopped: watch::Receiver<bool>,
) {
    let name = duty.as_str();
    loop {
        let taken = tokio::select! {
            taken = Lease::take(&database_url, Seat::Duty(duty), &holder, None) => taken,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let mut lease = match taken {
            Ok(lease) => lease,
            Err(err) => {
                tracing::warn!(duty = name, error = %err, "cannot wait for the duty's lease; retrying");
                if pause(&mut stopped).await {
                    return;
                }
                continue;
            }
        };
        let books = match Books::open_fenced(&database_url, &lease).await {
            Ok(books) => books,
            Err(err) => {
                tracing::warn!(duty = name, error = %err, "cannot open the duty's books; giving its lease up");
                drop(lease);
                if pause(&mut stopped).await {
                    return;
                }
                continue;
            }
        };
        let (end, ended) = watch::channel(false);
        let until_ended = move || -> Stopped {
            let mut ended = ended.clone();
            Box::pin(async move {
                let _ = ended.wait_for(|e| *e).await;
            })
        };
        let loops = match start(books.clone(), &until_ended) {
            Ok(loops) => loops,
            Err(err) => {
                // A configuration the node cannot run (a bad key file): another node may.
                tracing::error!(duty = name, error = %err, "cannot start the duty; giving its lease up");
                books.pool().close().await;
                drop(lease);
                if pause(&mut stopped).await {
                    return;
                }
                continue;
            }
        };
        tracing::info!(
            duty = name,
            epoch = lease.epoch(),
            "this node runs the duty"
        );
        let loops: Vec<JoinHandle<()>> = loops.into_iter().map(tokio::spawn).collect();
        let lost = tokio::select! {
            lost = lease.lost() => Some(lost),
            _ = stopped.wait_for(|s| *s) => None,
        };
        let _ = end.send(true);
        for run in loops {
            let _ = run.await;
        }
        books.pool().close().await;
        // The lock goes with the lease's connection: the next node waiting takes the duty.
        drop(lease);
        match lost {
            None => return,
            Some(lost) => {
                tracing::warn!(duty = name, error = %lost, "the duty stopped; waiting for its lease again")
            }
        }
    }
}

/// Waits a lease period; true if the node stops meanwhile.
async fn pause(stopped: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = stopped.wait_for(|s| *s) => true,
        () = tokio::time::sleep(LEASE_PERIOD) => false,
    }
}
