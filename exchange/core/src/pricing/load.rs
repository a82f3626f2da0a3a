//! What the market maker observes of a live market: the load it was built for
//! ([`super::hmm`]'s two numbers), from what an exchange can count — the work arriving into a
//! market over a sliding window, the work committed to it and not yet done, and the servers
//! (bundles) offering it.
//!
//! The definitions are those of the regime-shift simulation the maker's defaults were chosen
//! on ([`super::sim`]):
//!
//! ```text
//! offered_load ρ = arrived work over the window ÷ (servers × window)
//! occupancy    q = committed work ÷ (servers × mean job's work)
//! ```
//!
//! so ρ is utilisation (1.0: the servers would be busy all the time) and q counts committed
//! jobs per server in mean-job units (1.0: every server busy, nothing queued). Both are clamped
//! to [`MAX_OCCUPANCY`]: a market ten times over capacity is surging, whatever the exact figure.

use super::hmm::{MAX_OCCUPANCY, Observation};

/// Seconds of arrivals the offered load is measured over: long enough that a few jobs a
/// second do not make it jump by whole units, short enough that a surge shows within it.
pub const WINDOW_S: u64 = 10;

/// Work that arrived into one market, per second over the last [`WINDOW_S`] seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Arrivals {
    /// (unix second, jobs, work seconds), one slot per second modulo the window.
    slots: [(u64, u64, f64); WINDOW_S as usize],
}

impl Arrivals {
    /// Counts one job of `work_s` seconds arriving at `now_s` (negative or non-finite work
    /// counts as none).
    pub fn record(&mut self, now_s: u64, work_s: f64) {
        let slot = &mut self.slots[(now_s % WINDOW_S) as usize];
        if slot.0 != now_s {
            *slot = (now_s, 0, 0.0);
        }
        slot.1 += 1;
        if work_s.is_finite() && work_s > 0.0 {
            slot.2 += work_s;
        }
    }

    /// Jobs and work seconds that arrived in the window ending at `now_s` (inclusive).
    pub fn in_window(&self, now_s: u64) -> (u64, f64) {
        self.slots
            .iter()
            .filter(|(at, _, _)| *at <= now_s && now_s - *at < WINDOW_S)
            .fold((0, 0.0), |(jobs, work), (_, j, w)| (jobs + j, work + w))
    }
}

/// One market's load at one sweep.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MarketLoad {
    /// Bundles offering the market (its tier, holding its base).
    pub servers: u32,
    /// Jobs that arrived over the window.
    pub arrived_jobs: u64,
    /// Their work, seconds.
    pub arrived_s: f64,
    /// Jobs committed to the market's bundles and not yet done.
    pub committed_jobs: u64,
    /// Their work, seconds.
    pub committed_s: f64,
}

impl MarketLoad {
    /// The observation, or `None` when no bundle offers the market (no capacity to divide by:
    /// the maker keeps its state until one does).
    ///
    /// The mean job is that of the arrivals, else of the committed jobs; where the work is not
    /// known (0 s), jobs count as one mean job each.
    pub fn observation(&self, window_s: f64) -> Option<Observation> {
        if self.servers == 0 || !(window_s.is_finite() && window_s > 0.0) {
            return None;
        }
        let servers = f64::from(self.servers);
        let mean = |jobs: u64, work: f64| (jobs > 0 && work > 0.0).then(|| work / jobs as f64);
        let mean_work_s = mean(self.arrived_jobs, self.arrived_s)
            .or_else(|| mean(self.committed_jobs, self.committed_s));
        let (offered_load, occupancy) = match mean_work_s {
            Some(mean_work_s) => (
                self.arrived_s / (servers * window_s),
                self.committed_s / (servers * mean_work_s),
            ),
            None => (0.0, self.committed_jobs as f64 / servers),
        };
        let bounded = |x: f64| {
            if x.is_finite() {
                x.clamp(0.0, MAX_OCCUPANCY)
            } else {
                0.0
            }
        };
        Some(Observation {
            offered_load: bounded(offered_load),
            occupancy: bounded(occupancy),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_slide_out_of_the_window() {
        let mut a = Arrivals::default();
        a.record(100, 2.0);
        a.record(100, 1.0);
        a.record(105, 4.0);
        assert_eq!(a.in_window(105), (3, 7.0));
        assert_eq!(a.in_window(109), (3, 7.0));
        // Second 100 left the window at 110; its slot is reused at once by second 110.
        assert_eq!(a.in_window(110), (1, 4.0));
        a.record(110, f64::NAN);
        assert_eq!(a.in_window(110), (2, 4.0));
        assert_eq!(a.in_window(200), (0, 0.0));
    }

    #[test]
    fn load_is_utilisation_and_jobs_per_server() {
        let load = MarketLoad {
            servers: 2,
            arrived_jobs: 10,
            arrived_s: 20.0,
            committed_jobs: 6,
            committed_s: 12.0,
        };
        let obs = load.observation(10.0).unwrap();
        assert!((obs.offered_load - 1.0).abs() < 1e-12, "{obs:?}");
        assert!((obs.occupancy - 3.0).abs() < 1e-12, "{obs:?}");
        assert!(MarketLoad::default().observation(10.0).is_none());
        let idle = MarketLoad {
            servers: 3,
            ..MarketLoad::default()
        };
        assert_eq!(
            idle.observation(10.0),
            Some(Observation {
                offered_load: 0.0,
                occupancy: 0.0
            })
        );
        let flooded = MarketLoad {
            servers: 1,
            committed_jobs: 500,
            committed_s: 500.0,
            ..MarketLoad::default()
        };
        assert_eq!(flooded.observation(10.0).unwrap().occupancy, MAX_OCCUPANCY);
    }
}
