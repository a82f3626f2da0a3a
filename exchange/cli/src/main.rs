//! `cx`: the compute-exchange command line — clearing explained, capacity arithmetic, the market
//! simulation and the benchmarks. Each command prints a table for people and, with `--json`,
//! one JSON object as its last line for programs. Errors are one line on stderr and a non-zero
//! exit.

mod cli;

use clap::Parser;
use clap::error::ErrorKind;
use std::process::ExitCode;

/// Many small allocations per request (JSON, TLS records, clearing's decision) on every runtime
/// worker: mimalloc's per-thread heaps instead of glibc's locked arenas (`perf` of `cx bench
/// intake`: malloc and free ~12 % of the exchange's CPU with glibc).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(args) => args,
        Err(err) => return usage_error(&err),
    };
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: anyhow's alternate form joins the causes with ": ".
            eprintln!("error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

/// Help and version go out whole; a usage error is one line (clap's first), exit status 2.
fn usage_error(err: &clap::Error) -> ExitCode {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            ExitCode::from(2)
        }
        _ => {
            let text = err.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            eprintln!("{} (see --help)", first.trim_end());
            ExitCode::from(2)
        }
    }
}
