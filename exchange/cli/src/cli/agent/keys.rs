//! `cx agent keygen` and `cx agent bind`: the agent's key file (a secp256k1 account key and an
//! ML-DSA-65 identity) and the exchange's binding of the one to the other.

use super::{Args, pick_chain};
use anyhow::{Context, anyhow};
use cx_client::AgentKeys;
use cx_protocol::pq::Identity;
use serde_json::json;
use std::io::Read as _;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(super) struct KeygenArgs {
    /// Where to write the key file [default: --keys].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Replace an existing key file (its keys are lost).
    #[arg(long)]
    force: bool,
    /// Use an existing secp256k1 secret (32 bytes of hex) read from standard input, instead of
    /// a fresh one (a funded wallet's, say); the ML-DSA-65 identity is always fresh.
    #[arg(long)]
    import_secp256k1: bool,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(super) struct BindArgs {
    /// The binding's nonce (a rotation binds with a higher one).
    #[arg(long, default_value_t = 0)]
    nonce: u64,
    /// Also print the result as one JSON line.
    #[arg(long)]
    json: bool,
}

pub(super) fn run_keygen(args: &Args, keygen: &KeygenArgs) -> anyhow::Result<()> {
    let out = keygen
        .out
        .as_deref()
        .or(args.keys.as_deref())
        .ok_or_else(|| {
            anyhow!("no output file: pass --out FILE (or --keys FILE / CX_AGENT_KEYS)")
        })?;
    let keys = if keygen.import_secp256k1 {
        let mut text = zeroize::Zeroizing::new(String::new());
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the secp256k1 secret from standard input")?;
        let secret = cx_client::keys::parse_secret(&text)
            .map_err(|reason| anyhow!("the secp256k1 secret on standard input: {reason}"))?;
        AgentKeys::from_secrets(&secret, Identity::generate())?
    } else {
        AgentKeys::generate()
    };
    keys.write(out, keygen.force)?;
    let table = format!(
        "account          {}\nmldsa_key_hash   {}\nkey file         {} (0600)\n",
        keys.account(),
        keys.mldsa_key_hash(),
        out.display()
    );
    let report = json!({
        "account": keys.account(),
        "mldsa_key_hash": keys.mldsa_key_hash(),
        "path": out,
    });
    super::super::emit(keygen.json, &table, &report)
}

pub(super) async fn run_bind(args: &Args, bind: &BindArgs) -> anyhow::Result<()> {
    let keys = args.load_keys()?;
    let client = args.client()?;
    let chain = pick_chain(&client, args.chain, true).await?;
    let binding = keys.binding(&chain.domain(), bind.nonce)?;
    let bound = client
        .bind(&binding)
        .await
        .context("binding the ML-DSA-65 key")?;
    let table = format!(
        "account          {}\nmldsa_key_hash   {}\nbound on         chain {} (Settlement {})\n",
        bound.account, bound.mldsa_key_hash, chain.chain_id, chain.verifying_contract
    );
    super::super::emit(
        bind.json,
        &table,
        &json!({
            "account": bound.account,
            "mldsa_key_hash": bound.mldsa_key_hash,
            "chain_id": chain.chain_id,
            "verifying_contract": chain.verifying_contract,
        }),
    )
}
