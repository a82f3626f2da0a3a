//! The meter: one record per routed request, the single plane every reader uses.
//!
//! A routed request that an arm served leaves one [`MeterRecord`]: which arm, what it cost (integer
//! wei), what came back (latency, quality), the order's terms the outcome is judged against, and
//! the market maker's regime belief it was routed under. Three readers use the same records and
//! nothing else:
//!
//! - the expected-free-energy router folds them into its Dirichlet counts
//!   ([`crate::routing::efe::EfeRouter::learn`], a cursor into [`Meter::since`]);
//! - the bandit baseline in the replay takes its rewards from them;
//! - `cx bench pricing` and `cx simulate` report cost and deadline hits from [`Meter::summary`].
//!
//! So what the router learned from, what it was charged and what the benchmark reports cannot
//! drift apart: there is one source. The meter holds facts only; the router's discretisation of
//! them into outcome bands lives in [`crate::routing::outcome`].
//!
//! A fanned-out request leaves one record per arm that served it, all with the same `request`
//! id: each arm was paid and each outcome teaches the router about that arm.

use crate::error::{Result, invalid};
use crate::pricing::hmm::REGIMES;
use cx_protocol::Tier;
use serde::Serialize;
use std::collections::BTreeMap;

/// What one arm did for one routed request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MeterRecord {
    /// The request's id (shared by the records of a fanned-out request).
    pub request: u64,
    /// The tenant that sent it.
    pub tenant: String,
    /// The arm that served it (its catalog name; `model@provider-class` for per-class arms).
    pub arm: String,
    /// What the buyer was charged for it, wei.
    pub cost_wei: u128,
    /// Time from dispatch to a complete answer, seconds.
    pub latency_s: f64,
    /// Quality of the answer in [0, 1] (the verifier's or grader's score).
    pub quality: f64,
    /// The order's deadline, seconds (what latency is judged against).
    pub deadline_s: f64,
    /// The order's price limit for this request, wei (`None`: no limit).
    pub max_cost_wei: Option<u128>,
    /// The order's verification tier.
    pub tier: Tier,
    /// The market maker's regime belief the request was routed under.
    pub belief: [f64; REGIMES],
}

impl MeterRecord {
    /// Whether the answer came back by the deadline.
    pub fn deadline_hit(&self) -> bool {
        self.latency_s <= self.deadline_s
    }

    fn validate(&self) -> Result<()> {
        if !(self.latency_s.is_finite() && self.latency_s >= 0.0) {
            return Err(invalid("meter.latency_s", "must be finite and >= 0"));
        }
        if !(self.deadline_s.is_finite() && self.deadline_s > 0.0) {
            return Err(invalid("meter.deadline_s", "must be finite and > 0"));
        }
        if !(0.0..=1.0).contains(&self.quality) {
            return Err(invalid("meter.quality", "must be within [0, 1]"));
        }
        let sum: f64 = self.belief.iter().sum();
        if self.belief.iter().any(|b| !(b.is_finite() && *b >= 0.0)) || (sum - 1.0).abs() > 1e-6 {
            return Err(invalid(
                "meter.belief",
                format!("must be probabilities summing to 1, got {:?}", self.belief),
            ));
        }
        if self.arm.is_empty() {
            return Err(invalid("meter.arm", "must name the arm that served"));
        }
        Ok(())
    }
}

/// Totals over some records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MeterSummary {
    /// Distinct requests.
    pub requests: u64,
    /// Records (arms that served; more than `requests` under fan-out).
    pub served: u64,
    /// Total charged, wei.
    #[serde(with = "wei_string")]
    pub cost_wei: u128,
    /// Records whose answer met the deadline.
    pub on_time: u64,
    /// `on_time / served` (0 when nothing was served).
    pub deadline_hit_rate: f64,
    /// Mean quality of what was served.
    pub mean_quality: f64,
}

/// u128 wei does not fit a JSON number losslessly: it is written as a decimal string, as
/// `cx_protocol::price` writes rates.
mod wei_string {
    pub(super) fn serialize<S: serde::Serializer>(v: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }
}

/// Append-only records of routed requests.
#[derive(Debug, Clone, Default)]
pub struct Meter {
    records: Vec<MeterRecord>,
}

impl Meter {
    /// An empty meter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a record and returns its position; a record with a non-finite or out-of-range
    /// measurement is refused (with the field named) and not stored, so no reader sees it.
    pub fn record(&mut self, record: MeterRecord) -> Result<usize> {
        record.validate()?;
        self.records.push(record);
        Ok(self.records.len() - 1)
    }

    /// Every record, in the order recorded.
    pub fn records(&self) -> &[MeterRecord] {
        &self.records
    }

    /// Records from position `cursor` on (empty past the end): what a reader that has folded in
    /// `cursor` records has not seen yet.
    pub fn since(&self, cursor: usize) -> &[MeterRecord] {
        self.records.get(cursor..).unwrap_or(&[])
    }

    /// Records so far.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Totals over every record.
    pub fn summary(&self) -> MeterSummary {
        summarise(self.records.iter())
    }

    /// Totals per arm, by arm name.
    pub fn by_arm(&self) -> BTreeMap<&str, MeterSummary> {
        let mut groups: BTreeMap<&str, Vec<&MeterRecord>> = BTreeMap::new();
        for r in &self.records {
            groups.entry(r.arm.as_str()).or_default().push(r);
        }
        groups
            .into_iter()
            .map(|(arm, rs)| (arm, summarise(rs.into_iter())))
            .collect()
    }
}

fn summarise<'a>(records: impl Iterator<Item = &'a MeterRecord>) -> MeterSummary {
    let mut s = MeterSummary::default();
    let mut last_request = None;
    let mut requests = std::collections::BTreeSet::new();
    let mut quality = 0.0;
    for r in records {
        // Records of one request are adjacent in the common case; the set catches the rest.
        if last_request != Some(r.request) {
            requests.insert(r.request);
            last_request = Some(r.request);
        }
        s.served += 1;
        s.cost_wei = s.cost_wei.saturating_add(r.cost_wei);
        s.on_time += u64::from(r.deadline_hit());
        quality += r.quality;
    }
    s.requests = requests.len() as u64;
    if s.served > 0 {
        s.deadline_hit_rate = s.on_time as f64 / s.served as f64;
        s.mean_quality = quality / s.served as f64;
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(request: u64, arm: &str, latency_s: f64, cost_wei: u128) -> MeterRecord {
        MeterRecord {
            request,
            tenant: "t".into(),
            arm: arm.into(),
            cost_wei,
            latency_s,
            quality: 0.8,
            deadline_s: 2.0,
            max_cost_wei: Some(1_000),
            tier: Tier::T1,
            belief: [1.0, 0.0, 0.0],
        }
    }

    #[test]
    fn the_summary_counts_requests_once_and_every_arm_that_served() {
        let mut m = Meter::new();
        m.record(record(1, "a", 1.0, 100)).unwrap();
        // Request 2 fanned out to two arms; one was late.
        m.record(record(2, "a", 3.0, 50)).unwrap();
        m.record(record(2, "b", 1.5, 70)).unwrap();
        let s = m.summary();
        assert_eq!(
            (s.requests, s.served, s.cost_wei, s.on_time),
            (2, 3, 220, 2)
        );
        assert!((s.deadline_hit_rate - 2.0 / 3.0).abs() < 1e-12);
        let by_arm = m.by_arm();
        assert_eq!(by_arm["a"].cost_wei, 150);
        assert_eq!(by_arm["b"].on_time, 1);
        assert_eq!(m.since(1).len(), 2);
        assert!(m.since(9).is_empty());
    }

    #[test]
    fn a_bad_measurement_is_refused_and_never_stored() {
        let mut m = Meter::new();
        let mut bad = record(1, "a", f64::NAN, 1);
        assert!(
            m.record(bad.clone())
                .unwrap_err()
                .to_string()
                .contains("latency_s")
        );
        bad.latency_s = 1.0;
        bad.belief = [0.5, 0.0, 0.0];
        assert!(
            m.record(bad.clone())
                .unwrap_err()
                .to_string()
                .contains("belief")
        );
        bad.belief = [1.0, 0.0, 0.0];
        bad.quality = 1.5;
        assert!(m.record(bad).unwrap_err().to_string().contains("quality"));
        assert!(m.is_empty());
    }
}
