//! The load generator of `cx bench intake`, in a process of its own (`cx bench intake-load`,
//! hidden): the server and its runtime are then measured without the clients' TLS, HTTP and
//! timing on the same runtime. The bench writes the signed bodies to a file, one per line as
//! `CLIENT<TAB>BODY`, and the development CA's certificate beside it; this process opens one
//! keep-alive HTTPS connection per client, then (timing from there) posts each client's bodies
//! in order and prints one JSON object ([`LoadOutcome`]) on stdout.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use cx_exchange_server::tls;
use serde::{Deserialize, Serialize};

use super::intake::{bench_err, connect};
use super::load::{Sender, send_raw};
use crate::error::{Error, Result};

/// What the load process measured.
#[derive(Debug, Serialize, Deserialize)]
pub struct LoadOutcome {
    /// From the first request to the last answer, seconds (connections opened before).
    pub elapsed_s: f64,
    /// Each request's latency as the client saw it, ms.
    pub latencies_ms: Vec<f64>,
}

/// Posts the bodies of `bodies` (the file [`write_bodies`] wrote) to `address` over HTTPS
/// trusting `ca` (a PEM file): one connection per client, all open before the clock starts.
pub async fn intake_load(address: SocketAddr, ca: &Path, bodies: &Path) -> Result<LoadOutcome> {
    let roots = tls::certificates_from_pem_file(ca).map_err(bench_err)?;
    let client_config = tls::client_config(&roots).map_err(bench_err)?;
    let text = std::fs::read_to_string(bodies)
        .map_err(|e| Error::BenchFailed(format!("{}: {e}", bodies.display())))?;
    let mut per_client: Vec<Vec<Bytes>> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let (client, body) = line
            .split_once('\t')
            .and_then(|(c, b)| Some((c.parse::<usize>().ok()?, b)))
            .ok_or_else(|| {
                bench_err(format!(
                    "{}: line {} is not CLIENT<TAB>BODY",
                    bodies.display(),
                    n + 1
                ))
            })?;
        if client >= per_client.len() {
            per_client.resize_with(client + 1, Vec::new);
        }
        per_client[client].push(Bytes::copy_from_slice(body.as_bytes()));
    }
    let mut senders = Vec::with_capacity(per_client.len());
    for _ in &per_client {
        senders.push(connect(address, client_config.clone()).await?);
    }
    let started = Instant::now();
    let tasks: Vec<_> = senders
        .into_iter()
        .zip(per_client)
        .map(|(sender, bodies)| tokio::spawn(post_all(sender, bodies)))
        .collect();
    let mut latencies_ms = Vec::new();
    for task in tasks {
        latencies_ms.extend(
            task.await
                .map_err(|e| Error::BenchFailed(format!("client task: {e}")))??,
        );
    }
    Ok(LoadOutcome {
        elapsed_s: started.elapsed().as_secs_f64(),
        latencies_ms,
    })
}

/// Writes `per_client`'s bodies to `path` for [`intake_load`].
pub(crate) fn write_bodies(path: &Path, per_client: &[Vec<String>]) -> Result<()> {
    let mut out = String::new();
    for (client, bodies) in per_client.iter().enumerate() {
        for body in bodies {
            // Compact JSON holds no raw tab or newline: one body a line.
            out += &format!("{client}\t{body}\n");
        }
    }
    std::fs::write(path, out).map_err(|e| Error::BenchFailed(format!("{}: {e}", path.display())))
}

/// Runs `load_bin bench intake-load` against `address` and waits for what it measured.
pub(crate) async fn run_load_process(
    load_bin: &Path,
    address: SocketAddr,
    ca: &Path,
    bodies: &Path,
) -> Result<LoadOutcome> {
    let output = tokio::process::Command::new(load_bin)
        .args(["bench", "intake-load", "--address"])
        .arg(address.to_string())
        .arg("--ca")
        .arg(ca)
        .arg("--bodies")
        .arg(bodies)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Error::BenchFailed(format!("{}: {e}", load_bin.display())))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(Error::BenchFailed(format!(
            "the load process failed ({}): {}",
            output.status,
            stderr.lines().last().unwrap_or("no message")
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .map_err(|e| bench_err(format!("the load process's answer: {e}")))
}

/// Posts `bodies` in order on `sender`'s keep-alive connection; the latency of each, ms. Every
/// answer must be 202.
async fn post_all(mut sender: Sender, bodies: Vec<Bytes>) -> Result<Vec<f64>> {
    let mut latencies = Vec::with_capacity(bodies.len());
    for body in bodies {
        let started = Instant::now();
        let (status, _, answer) = send_raw(&mut sender, "/v1/intents", None, body).await?;
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        if status != hyper::StatusCode::ACCEPTED {
            return Err(Error::BenchFailed(format!(
                "an intent was refused ({status}): {}",
                String::from_utf8_lossy(&answer)
            )));
        }
    }
    Ok(latencies)
}
