//! The devnet's ports (ARCHITECTURE "Processes and ports"), shifted together by
//! `--port-offset`, and the check that every one is free before anything starts.

use anyhow::bail;
use std::net::TcpListener;

/// Every port the devnet listens on, on 127.0.0.1.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ports {
    offset: u16,
    providers: u16,
    signers: u16,
    exchange_nodes: u16,
}

/// The defaults with offset 0.
const EXCHANGE: u16 = 8443;
const CHAINS: [u16; 2] = [8545, 8546];
const FIRST_PROVIDER: u16 = 9001;
const FIRST_SIGNER: u16 = 9101;
/// The exchange's nodes when there are several (`--exchanges N`): the balancer takes
/// [`EXCHANGE`], node i listens here + i.
const FIRST_EXCHANGE_NODE: u16 = 8451;

impl Ports {
    pub(super) fn new(offset: u16, providers: u16, signers: u16, exchange_nodes: u16) -> Self {
        Self {
            offset,
            providers,
            signers,
            exchange_nodes,
        }
    }

    pub(super) fn exchange(&self) -> u16 {
        EXCHANGE + self.offset
    }

    /// Node i's port when the exchange runs several (the balancer has [`Ports::exchange`]).
    pub(super) fn exchange_node(&self, i: u16) -> u16 {
        FIRST_EXCHANGE_NODE + self.offset + i
    }

    /// Chain i's JSON-RPC port (i in 0..2).
    pub(super) fn chain(&self, i: usize) -> u16 {
        CHAINS[i] + self.offset
    }

    pub(super) fn provider(&self, i: u16) -> u16 {
        FIRST_PROVIDER + self.offset + i
    }

    pub(super) fn first_signer(&self) -> u16 {
        FIRST_SIGNER + self.offset
    }

    /// Each port with what it is for.
    fn all(&self) -> Vec<(u16, String)> {
        let mut all = vec![(self.exchange(), "the exchange (HTTPS)".to_owned())];
        if self.exchange_nodes > 1 {
            for i in 0..self.exchange_nodes {
                all.push((self.exchange_node(i), format!("exchange node {}", i + 1)));
            }
        }
        for (i, chain) in super::CHAIN_IDS.iter().enumerate() {
            all.push((self.chain(i), format!("Anvil chain {chain}")));
        }
        for i in 0..self.providers {
            all.push((self.provider(i), format!("provider {}", i + 1)));
        }
        for i in 0..self.signers {
            all.push((self.first_signer() + i, format!("signer {}", i + 1)));
        }
        all
    }

    /// Fails, naming the port, what the devnet wanted it for and what to do, when one is taken:
    /// before anything starts (and before the database is recreated), so a second `cx devnet`
    /// leaves the first one running untouched.
    pub(super) fn check_free(&self) -> anyhow::Result<()> {
        for (port, what) in self.all() {
            if let Err(e) = TcpListener::bind(("127.0.0.1", port)) {
                let why = if e.kind() == std::io::ErrorKind::AddrInUse {
                    "is already in use".to_owned()
                } else {
                    format!("cannot be bound ({e})")
                };
                bail!(
                    "port {port} (for {what}) {why}: is another `cx devnet` running? Stop it with \
                     Ctrl-C, see what holds the port with `ss -ltnp 'sport = :{port}'`, or start \
                     this one on other ports with --port-offset N (every port + N)"
                );
            }
        }
        Ok(())
    }
}
