//! A JSON-RPC front for a node that lags behind the chain head, as a signer's own node does when
//! it is slow to import blocks: every call is passed to the real node, except that "latest"
//! means a block the front holds back ([`LaggingRpc::hold_at`]). `eth_blockNumber` and
//! `eth_getBlockByNumber("latest")` answer that block; everything else (reads at a block hash,
//! logs, sends) goes through unchanged, so a party that pins the latest block (as
//! `ChainView::pinned` does) reads the whole chain as it stood then.

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use alloy::providers::{DynProvider, Provider};
use alloy::transports::RpcError;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};

/// The front; stops when dropped.
pub struct LaggingRpc {
    url: String,
    held: Arc<Mutex<Option<u64>>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for LaggingRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaggingRpc")
            .field("url", &self.url)
            .finish()
    }
}

impl Drop for LaggingRpc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LaggingRpc {
    /// A front for the node at `upstream` on a free loopback port, holding nothing back yet.
    pub async fn start(upstream: &str) -> Result<Self> {
        let node = cx_settlement::evm::read_provider(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::BenchFailed(format!("bind: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::BenchFailed(format!("bind: {e}")))?
            .port();
        let held = Arc::new(Mutex::new(None));
        let task = tokio::spawn(serve(listener, node, held.clone()));
        Ok(Self {
            url: format!("http://127.0.0.1:{port}"),
            held,
            task,
        })
    }

    /// Its JSON-RPC URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// "latest" is block `number` from now on (`None`: the real head again).
    pub fn hold_at(&self, number: Option<u64>) {
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = number;
    }
}

async fn serve(listener: TcpListener, node: DynProvider, held: Arc<Mutex<Option<u64>>>) {
    while let Ok((stream, _)) = listener.accept().await {
        let node = node.clone();
        let held = held.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let node = node.clone();
                let held = held.clone();
                async move {
                    let body = request
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let answer = answer(&node, &held, &body).await;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(answer.to_string())))
                            .expect("a static header"),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The answer to one request body: a call or a batch of calls.
async fn answer(node: &DynProvider, held: &Mutex<Option<u64>>, body: &[u8]) -> Value {
    let held = *held.lock().unwrap_or_else(|p| p.into_inner());
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(calls)) => {
            let mut answers = Vec::with_capacity(calls.len());
            for call in calls {
                answers.push(one(node, held, call).await);
            }
            Value::Array(answers)
        }
        Ok(call) => one(node, held, call).await,
        Err(e) => json!({"jsonrpc": "2.0", "id": null,
                         "error": {"code": -32700, "message": e.to_string()}}),
    }
}

async fn one(node: &DynProvider, held: Option<u64>, call: Value) -> Value {
    let id = call.get("id").cloned().unwrap_or(Value::Null);
    let method = call
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let mut params = call.get("params").cloned().unwrap_or(json!([]));
    if let Some(number) = held {
        let tag = json!(format!("0x{number:x}"));
        if method == "eth_blockNumber" {
            return json!({"jsonrpc": "2.0", "id": id, "result": tag});
        }
        if method == "eth_getBlockByNumber" && params.get(0) == Some(&json!("latest")) {
            params[0] = tag;
        }
    }
    let raw = serde_json::value::to_raw_value(&params).expect("JSON values serialise");
    match node.raw_request_dyn(Cow::Owned(method), &raw).await {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(RpcError::ErrorResp(payload)) => json!({"jsonrpc": "2.0", "id": id, "error": payload}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id,
                         "error": {"code": -32603, "message": e.to_string()}}),
    }
}
