//! Runs the pricing benchmark and prints its table, then its report as one JSON line (what
//! `cx bench pricing --json` prints last): `cargo run --release --example pricing_bench -p cx-exchange`.

use cx_exchange::pricing::bench::{PricingBenchConfig, run_pricing_bench};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let report = run_pricing_bench(&PricingBenchConfig::default())?;
    println!("{}", report.table());
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
