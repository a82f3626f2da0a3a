//! The devnet's agents before the traffic starts: the market they share (the chains as the
//! exchange serves them, the adapters' ids), then each agent bound with a tab on every chain;
//! the first stores the adapters, and one more, `try`, is kept idle for a person's commands.

use super::traffic::{self, Agent, Market, OpenTab, Side};
use super::{ADAPTERS, Config};
use alloy::signers::local::PrivateKeySigner;
use anyhow::anyhow;
use cx_client::Client;
use cx_contracts::DeploymentsFile;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The agents, ready to send.
pub(super) struct Agents {
    /// What they share.
    pub(super) market: Arc<Market>,
    /// The seeded ones with their open tabs (one per chain).
    pub(super) seeded: Vec<(Agent, Vec<OpenTab>)>,
    /// The tabs of `try`, the agent left for the commands printed at start.
    pub(super) try_tabs: Vec<OpenTab>,
    /// Their key files (`<name>.json`).
    pub(super) dir: PathBuf,
}

/// Binds `config.agents` seeded agents and `try` (Anvil keys from `2 + providers` on), each
/// with a tab on every chain of `file`, and stores the adapters of `adapters_dir` through the
/// first; the market's traffic log goes to `dir/traffic.log`.
pub(super) async fn start(
    config: &Config,
    client: &Client,
    file: &DeploymentsFile,
    keys: &[PrivateKeySigner],
    dir: &Path,
    adapters_dir: &Path,
    model_name: &str,
) -> anyhow::Result<Agents> {
    let served = client.chains().await?;
    let sides: Vec<Side> = file
        .chains
        .iter()
        .map(|c| {
            let info = served
                .iter()
                .find(|s| s.chain_id == c.chain.chain_id)
                .cloned()
                .ok_or_else(|| anyhow!("the exchange does not serve chain {}", c.chain.chain_id))?;
            Ok(Side {
                info,
                rpc_url: c.chain.rpc_url.clone(),
                deployment: c.deployment,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    // The adapters' ids now; they are stored once the first agent holds a tab (storing needs an
    // account with money at stake).
    let adapters = (0..ADAPTERS)
        .map(|k| traffic::adapter_id(&adapters_dir.join(format!("adapter-{k:03}"))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let traffic_log = std::fs::File::create(dir.join("traffic.log"))?;
    let market = Arc::new(Market {
        client: client.clone(),
        sides,
        model: model_name.to_owned(),
        adapters,
        verified_tier: if config.providers >= 2 {
            cx_protocol::Tier::T1
        } else {
            cx_protocol::Tier::T0
        },
        // Operators are assigned round robin over three (`operator-{i % 3 + 1}`).
        t3: config.providers >= 3,
        adapters_stored: Default::default(),
        stats: Default::default(),
        log: std::sync::Mutex::new(traffic_log),
    });
    let agents_dir = dir.join("agents");
    std::fs::create_dir_all(&agents_dir)?;
    let first_agent_key = 2 + usize::from(config.providers);
    let mut agents = Vec::new();
    for a in 0..=config.agents {
        // The last one is left for the commands printed below.
        let name = if a == config.agents {
            "try".to_owned()
        } else {
            format!("agent-{}", a + 1)
        };
        let agent = Agent::new(
            name.clone(),
            &keys[first_agent_key + usize::from(a)],
            &market.sides,
            &agents_dir.join(format!("{name}.json")),
        )?;
        agent.bind(&market).await?;
        let mut tabs = Vec::new();
        for side in 0..market.sides.len() {
            // The first tabs close soon (staggered), so batches land within the first minute.
            let close_after = Duration::from_secs(8 + 3 * u64::from(a) + 2 * side as u64);
            tabs.push(agent.open_tab(&market, side, close_after).await?);
        }
        if a == 0 {
            for k in 0..ADAPTERS {
                let dir = adapters_dir.join(format!("adapter-{k:03}"));
                traffic::put_adapter(agent.own(&market), &dir).await?;
            }
            market
                .adapters_stored
                .store(true, std::sync::atomic::Ordering::Release);
            // Its tabs opened before the adapters were stored: their rents go in now.
            for (side, tab) in tabs.iter().enumerate() {
                let rented = agent.rent(&market, side, tab.escrow_id).await;
                market.count_refused(&agent.name, rented);
            }
        }
        agents.push((agent, tabs));
    }
    // Its tabs stay open: nothing sends on them but the person trying the commands.
    let (_try_agent, try_tabs) = agents.pop().expect("the agent to try");
    Ok(Agents {
        market,
        seeded: agents,
        try_tabs,
        dir: agents_dir,
    })
}
