//! The load balancer of `cx devnet --exchanges N` (and of the tests that run the exchange as a
//! cluster): one address (the exchange's) in front of the N `cx serve` nodes, each on a port of
//! its own. Connections, not requests, are balanced
//! (TLS ends at the nodes): each new connection goes to the next node in turn, and to the one
//! after it when a node does not accept (a killed one), so a client reconnecting after a node
//! died lands on a live one. Any node serves any request: the writer itself, the others by
//! forwarding to it (`cx_exchange_server::cluster`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A node that does not accept within this is skipped for the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The balancer, running until dropped.
pub struct Balancer {
    task: JoinHandle<()>,
}

impl Balancer {
    /// Balances connections to `listener` over `nodes`.
    pub fn start(listener: TcpListener, nodes: Vec<SocketAddr>) -> Self {
        let next = Arc::new(AtomicUsize::new(0));
        let nodes = Arc::new(nodes);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    // Out of descriptors, a reset before accept: the next one may do.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let first = next.fetch_add(1, Ordering::Relaxed);
                let nodes = nodes.clone();
                tokio::spawn(async move {
                    if let Some(mut node) = connect(&nodes, first).await {
                        let mut client = client;
                        let _ = client.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut node).await;
                    }
                });
            }
        });
        Self { task }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first node, from `first` on in turn, that accepts a connection.
async fn connect(nodes: &[SocketAddr], first: usize) -> Option<TcpStream> {
    for i in 0..nodes.len() {
        let node = nodes[(first + i) % nodes.len()];
        if let Ok(Ok(stream)) =
            tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(node)).await
        {
            let _ = stream.set_nodelay(true);
            return Some(stream);
        }
    }
    None
}
