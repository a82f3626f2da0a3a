//! The product-versus-Freivalds figures of `cx-provider bench matmul` from this crate alone
//! (a release build of it takes seconds): `cargo run --release -p cx-kernels --example
//! matmul_check [-- ROUNDS]`.

fn main() -> Result<(), cx_kernels::Error> {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let figures =
        cx_kernels::bench::matmul::matmul(&cx_kernels::bench::matmul::MatmulBenchOptions {
            repeats: 5,
            rounds,
            cpu: cx_kernels::CpuConfig::default(),
            sizes: vec![512, 1024],
        })?;
    print!("{}", figures.table());
    Ok(())
}
