//! Small steps the orchestration repeats: a tool run to completion with its output in a log,
//! the database and the folder made afresh, readiness polled.

use anyhow::{Context, anyhow, bail};
use sqlx::Connection as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `program args…` to completion; its output goes to `log` and its failure names it.
pub(super) fn run_tool(program: &Path, args: &[&str], log: &Path) -> anyhow::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("{}", log.display()))?;
    let status = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running {}", program.display()))?;
    if !status.success() {
        bail!(
            "{} {} failed ({status}); see {}",
            program.display(),
            args.join(" "),
            log.display()
        );
    }
    Ok(())
}

/// Drops and creates the database of `url` (its chains are fresh, so its books must be).
pub(super) async fn recreate_database(url: &str) -> anyhow::Result<()> {
    let base = url.split('?').next().unwrap_or_default();
    let (prefix, name) = base
        .rsplit_once('/')
        .ok_or_else(|| anyhow!("DATABASE_URL {url:?} names no database"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("DATABASE_URL: the devnet recreates its database, and {name:?} is not a plain name");
    }
    let mut admin = sqlx::PgConnection::connect(&format!("{prefix}/postgres"))
        .await
        .context("connecting to PostgreSQL (DATABASE_URL; scripts/setup.sh starts one)")?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("dropping database {name}"))?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("creating database {name}"))?;
    Ok(())
}

/// Empties `dir` but for the CA (trusted once, kept across starts).
pub(super) fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--dir {}", dir.display()))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == "ca" {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("clearing {}", path.display()))?;
    }
    Ok(())
}

pub(super) fn arg(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

/// Bytes of the files under `dir`, recursively.
pub(super) fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Polls `check` every 250 ms until it holds, or fails after `within` naming `what`.
pub(super) async fn wait_for<F, Fut>(
    within: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        if start.elapsed() > within {
            bail!("{what}: not ready within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
