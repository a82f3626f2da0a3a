//! Progress while the devnet starts: a spinner on a terminal, plain lines otherwise.

use indicatif::{ProgressBar, ProgressStyle};
use std::time::{Duration, Instant};

/// Progress while it starts: a spinner on a terminal, plain lines otherwise.
pub(super) struct Steps {
    bar: ProgressBar,
    started: Instant,
    current: Option<(String, Instant)>,
}

impl Steps {
    pub(super) fn new(total: u64) -> Self {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} ({elapsed})")
                .expect("a valid template")
                .tick_chars("|/-\\ "),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Self {
            bar,
            started: Instant::now(),
            current: None,
        }
    }

    pub(super) fn say(&self, line: &str) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub(super) fn step(&mut self, what: &str) {
        self.finish_step();
        self.bar.set_message(what.to_owned());
        self.current = Some((what.to_owned(), Instant::now()));
    }

    fn finish_step(&mut self) {
        if let Some((what, at)) = self.current.take() {
            self.bar.inc(1);
            self.say(&format!(
                "  ok  {what} ({:.1} s)",
                at.elapsed().as_secs_f64()
            ));
        }
    }

    pub(super) fn done(mut self) -> Duration {
        self.finish_step();
        self.bar.finish_and_clear();
        self.started.elapsed()
    }
}
