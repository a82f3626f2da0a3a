//! Every process the devnet started, held outside the running future so that however it ends
//! (done, failed, Ctrl-C, SIGTERM) dropping them stops each one, clients before servers.

use crate::{AnvilInstance, Cluster, Supervised, Usage};

/// Every process the devnet started.
#[derive(Default)]
pub(super) struct Children {
    pub(super) chains: Vec<AnvilInstance>,
    pub(super) cluster: Option<Cluster>,
    pub(super) others: Vec<Supervised>,
    /// In front of the exchange's nodes when there are several.
    pub(super) balancer: Option<crate::balancer::Balancer>,
}

impl Children {
    pub(super) fn count(&self) -> usize {
        self.chains.len()
            + self.cluster.as_ref().map_or(0, |c| c.processes().count())
            + self.others.len()
    }

    pub(super) fn usage(&self) -> Vec<Usage> {
        let mut all: Vec<Usage> = self.others.iter().filter_map(Supervised::usage).collect();
        all.extend(self.chains.iter().filter_map(|c| c.process().usage()));
        if let Some(cluster) = &self.cluster {
            all.extend(cluster.processes().filter_map(Supervised::usage));
        }
        all.extend(Usage::of(std::process::id()));
        all
    }

    /// The first child the market cannot go on without that exited, by name. A provider is not
    /// one: when a provider dies the exchange re-clears or refunds its jobs (SPEC §8), as it
    /// would for a third party's; [`Children::lost_providers`] names it once.
    pub(super) fn exited(&mut self) -> Option<String> {
        // The exchange is lost when every node is: another takes over from a dead writer.
        let exchanges: Vec<bool> = self
            .others
            .iter_mut()
            .filter(|c| is_exchange(c.name()))
            .map(|c| c.is_running())
            .collect();
        if !exchanges.is_empty() && !exchanges.contains(&true) {
            return Some("the exchange (every node)".to_owned());
        }
        let other = self.others.iter_mut().find_map(|c| {
            (!is_provider(c.name()) && !is_exchange(c.name()) && !c.is_running())
                .then(|| c.name().to_owned())
        });
        other.or_else(|| {
            self.chains
                .iter_mut()
                .find_map(|c| (!c.is_running()).then(|| format!("anvil (chain {})", c.chain_id)))
        })
    }
}

impl Children {
    /// Providers that exited since the last call, by name (each named once).
    pub(super) fn lost_providers(
        &mut self,
        reported: &mut std::collections::BTreeSet<String>,
    ) -> Vec<String> {
        let mut lost = Vec::new();
        for child in &mut self.others {
            if is_provider(child.name()) && !reported.contains(child.name()) && !child.is_running()
            {
                reported.insert(child.name().to_owned());
                lost.push(child.name().to_owned());
            }
        }
        lost
    }
}

/// Whether a supervised child is one of the exchange's `cx serve` nodes.
fn is_exchange(name: &str) -> bool {
    name.starts_with("the exchange")
}

/// Whether a supervised child is one of the devnet's providers (named `provider-N`).
fn is_provider(name: &str) -> bool {
    name.starts_with("provider-")
}

impl Drop for Children {
    fn drop(&mut self) {
        // Clients before servers: providers and the exchange, then signers, then chains.
        while let Some(mut child) = self.others.pop() {
            child.kill();
        }
        self.cluster = None;
        self.chains.clear();
    }
}
