//! The counters behind `GET /metrics` ([`super::health`]): the Prometheus text exposition of what the door has seen — intents accepted and
//! refused (by error code) and the time intake took.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the handlers update.
#[derive(Debug, Default)]
pub(super) struct Metrics {
    accepted: AtomicU64,
    refused: Mutex<BTreeMap<&'static str, u64>>,
    intake_micros: AtomicU64,
}

impl Metrics {
    pub(super) fn accepted(&self, micros: u64) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
        self.intake_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub(super) fn refused(&self, code: &'static str, micros: u64) {
        *self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default() += 1;
        self.intake_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of the counters, with the service's uptime.
    pub(super) fn render(&self, uptime_s: u64) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP cx_intents_accepted_total Signed intents accepted and committed."
        );
        let _ = writeln!(out, "# TYPE cx_intents_accepted_total counter");
        let _ = writeln!(
            out,
            "cx_intents_accepted_total {}",
            self.accepted.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP cx_intents_refused_total Intents refused, by error code."
        );
        let _ = writeln!(out, "# TYPE cx_intents_refused_total counter");
        for (code, n) in self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(out, "cx_intents_refused_total{{code=\"{code}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP cx_intake_seconds_total Time spent in intake (verify, clear, commit)."
        );
        let _ = writeln!(out, "# TYPE cx_intake_seconds_total counter");
        let _ = writeln!(
            out,
            "cx_intake_seconds_total {}",
            self.intake_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "# HELP cx_uptime_seconds Seconds since the service started."
        );
        let _ = writeln!(out, "# TYPE cx_uptime_seconds gauge");
        let _ = writeln!(out, "cx_uptime_seconds {uptime_s}");
        out
    }
}
