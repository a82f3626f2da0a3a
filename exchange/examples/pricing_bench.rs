//! Runs the pricing benchmark and prints its report as JSON (what `cx bench pricing --json`
//! prints last): `cargo run --release --example pricing_bench -p cx-exchange`.

use cx_exchange::pricing::bench::{PricingBenchConfig, run_pricing_bench};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let report = run_pricing_bench(&PricingBenchConfig::default())?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
