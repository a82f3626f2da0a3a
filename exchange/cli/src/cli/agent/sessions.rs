//! `cx agent session` and `cx agent chat`: a session key for the OpenAI-compatible door (a
//! signed grant naming the hash of a fresh secret) and a chat completion asked with it.

use super::{Args, fresh_nonce, now_s, parse_class, parse_tier, pick_chain};
use anyhow::{Context, anyhow};
use cx_protocol::order;
use cx_protocol::{DeterminismClass, Tier};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub(super) struct SessionArgs {
    /// The tab (escrow id) its calls draw on.
    #[arg(long, value_name = "ID")]
    tab: u64,
    /// The most all its calls together may spend, wei.
    #[arg(long, value_name = "WEI")]
    cap_wei: u128,
    /// Seconds from now until the key stops working.
    #[arg(long, value_name = "S", default_value_t = 3600)]
    expires_in: u64,
    /// A call's deadline, seconds after it arrives, unless the call says otherwise.
    #[arg(long, value_name = "S", default_value_t = 60)]
    deadline_in: u64,
    /// A call's price limit unless it says otherwise, wei.
    #[arg(long, value_name = "WEI")]
    max_price_wei: u128,
    /// A call's lowest verification tier unless it says otherwise: T0, T1, T2 or T3.
    #[arg(long, default_value = "T1", value_parser = parse_tier)]
    tier: Tier,
    /// A call's determinism class unless it says otherwise: D, D_inf or S.
    #[arg(long, default_value = "D", value_parser = parse_class)]
    class: DeterminismClass,
    /// The grant's nonce [default: the current time in microseconds].
    #[arg(long)]
    nonce: Option<u64>,
    /// Also write the key to this file (mode 0600) instead of only printing it.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(super) struct ChatArgs {
    /// The session key (made by `cx agent session`).
    #[arg(long, env = "CX_API_KEY", value_name = "KEY", hide_env_values = true)]
    api_key: String,
    /// A catalog model, an adapter's content id, or a task the router maps to a model
    /// (`task:<name>`, `cx/auto`, `cx/fanout:N`).
    #[arg(long)]
    model: String,
    /// The user's message.
    message: String,
    /// Most tokens to generate.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_tokens: u32,
    /// Seconds the call may take [default: the session's].
    #[arg(long, value_name = "S")]
    deadline_in: Option<u64>,
    /// Also print the whole completion as one JSON line.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run_session(args: &Args, cmd: &SessionArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, false).await?;
    // The key is a fresh 256-bit secret; only its SHA-256 is signed and stored.
    let mut secret = zeroize::Zeroizing::new([0u8; 32]);
    getrandom::fill(&mut *secret).map_err(|e| anyhow!("no randomness from the OS: {e}"))?;
    let key = zeroize::Zeroizing::new(format!("cxs_{}", hex::encode(*secret)));
    let grant = order::SessionGrant {
        tab_id: cmd.tab,
        spend_cap_wei: cmd.cap_wei,
        expiry_s: now_s().saturating_add(cmd.expires_in),
        default_deadline_s: cmd.deadline_in,
        default_tier: cmd.tier,
        default_determinism: cmd.class,
        default_max_price_wei: cmd.max_price_wei,
        bearer_hash: order::SessionGrant::bearer_hash_of(key.as_bytes()),
        nonce: cmd.nonce.unwrap_or_else(fresh_nonce),
    };
    let signed = keys.sign(grant, &chain.domain())?;
    let opened = client
        .open_session(&signed)
        .await
        .context("storing the session grant")?;
    if let Some(path) = &cmd.out {
        write_secret(path, key.as_bytes()).with_context(|| format!("--out {}", path.display()))?;
    }
    let table = format!(
        "session          {}
tab              {} on chain {}
spend_cap_wei    {}
expiry_s         {}
api_key          {}
try              OPENAI_BASE_URL={}/v1 OPENAI_API_KEY=<api_key> (any OpenAI client)
",
        opened.session_id,
        opened.tab_id,
        opened.chain_id,
        opened.spend_cap_wei,
        opened.expiry_s,
        key.as_str(),
        client.base_url()
    );
    super::super::emit(
        cmd.json,
        &table,
        &json!({
            "session_id": opened.session_id,
            "chain_id": opened.chain_id,
            "tab_id": opened.tab_id,
            "spend_cap_wei": opened.spend_cap_wei.to_string(),
            "expiry_s": opened.expiry_s,
            "api_key": key.as_str(),
        }),
    )
}

/// Writes a secret to a new file readable by its owner alone (0600), refusing to replace one.
fn write_secret(path: &Path, secret: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            anyhow!("already exists; choose another file")
        } else {
            anyhow!("{e}")
        }
    })?;
    file.write_all(secret)?;
    file.write_all(b"\n")?;
    Ok(())
}

pub(super) async fn run_chat(args: &Args, cmd: &ChatArgs) -> anyhow::Result<()> {
    let mut body = json!({
        "model": cmd.model,
        "messages": [{"role": "user", "content": cmd.message}],
        "max_tokens": cmd.max_tokens,
    });
    if let Some(s) = cmd.deadline_in {
        body["cx"] = json!({"deadline_in_s": s});
    }
    // The answer comes when a provider's result is in: wait past the longest deadline a call
    // may have.
    let client = args.client()?.with_timeout(std::time::Duration::from_secs(
        cmd.deadline_in.unwrap_or(600) + 10,
    ));
    let completion = client
        .chat(cmd.api_key.trim(), &body)
        .await
        .context("chat completion")?;
    let text = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default();
    let table = format!(
        "{text}\n-- job {} on {}, {} tokens\n",
        completion["cx"]["job_id"].as_str().unwrap_or("?"),
        completion["cx"]["bundle_id"].as_str().unwrap_or("?"),
        completion["usage"]["completion_tokens"]
    );
    super::super::emit(cmd.json, &table, &completion)
}
