//! A framed transport over TCP that runs the post-quantum handshake and then carries sealed
//! frames.
//!
//! Wire format: every frame is a 4-byte big-endian length followed by that many bytes. The first
//! three frames are the handshake of [`cx_protocol::pq::session`] (M1 initiator → responder, M2
//! back, M3 forward: hybrid ML-KEM-768 (FIPS 203) + X25519, both sides authenticated by ML-DSA-65
//! (FIPS 204) signatures over the transcript, each side's identity pinned in advance). Every later
//! frame is a ChaCha20-Poly1305 frame of the session (sequence number as nonce), carrying one JSON
//! message. A frame that is replayed, reordered or altered fails to open and the connection is
//! dropped: a session that saw one bad frame is never trusted again.
//!
//! Bounds: a frame is at most [`Limits::max_frame_bytes`] (checked on the length prefix, before
//! anything is allocated), and every read and write has a deadline, so a silent or slow peer
//! costs a timeout, not a stuck task. The state machines live in `cx-protocol`; this module
//! only moves their bytes.

use std::collections::HashMap;
use std::time::Duration;

use cx_protocol::pq::session::{M1_BYTES, M2_BYTES, M3_BYTES};
use cx_protocol::pq::{Identity, IdentityId, Initiator, PublicIdentity, Responder, Session};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::error::{Error, Result};

/// Size and time bounds of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest frame accepted or sent (bytes of the body, after the length prefix).
    pub max_frame_bytes: usize,
    /// Deadline of one read or write (and of connecting).
    pub io_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // A full batch part fits: 400 vouchers of ~35 KB of JSON each (four ML-DSA-65
            // signatures and two keys, hex) and both balance lists of 25,000 parties
            // (`ledger::MAX_RECEIPTS_PER_BATCH`, its test `a_full_part_fits_one_frame`).
            max_frame_bytes: 24 << 20,
            io_timeout: Duration::from_secs(10),
        }
    }
}

/// Known public identities by id: who may open a session with us.
pub type Directory = HashMap<IdentityId, PublicIdentity>;

fn transport(what: impl Into<String>) -> Error {
    Error::Transport(what.into())
}

async fn with_timeout<T>(
    limits: &Limits,
    what: &str,
    f: impl Future<Output = std::io::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limits.io_timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(transport(format!("{what}: {e}"))),
        Err(_) => Err(transport(format!(
            "{what}: no progress within {} ms",
            limits.io_timeout.as_millis()
        ))),
    }
}

/// Writes one length-prefixed frame (to a socket; any async writer, so tests and the fuzz
/// targets can frame into memory).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    stream: &mut W,
    body: &[u8],
    limits: &Limits,
) -> Result<()> {
    if body.len() > limits.max_frame_bytes {
        return Err(transport(format!(
            "frame of {} bytes exceeds the {}-byte limit",
            body.len(),
            limits.max_frame_bytes
        )));
    }
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&(body.len() as u32).to_be_bytes());
    buf.extend_from_slice(body);
    with_timeout(limits, "write", stream.write_all(&buf)).await
}

/// Reads one length-prefixed frame, refusing a length over the limit before allocating. Any
/// async reader: a signer's socket, or the bytes a fuzz target hands it.
pub async fn read_frame<R: AsyncRead + Unpin>(stream: &mut R, limits: &Limits) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    with_timeout(limits, "read", stream.read_exact(&mut len)).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > limits.max_frame_bytes {
        return Err(transport(format!(
            "peer announced a {len}-byte frame, over the {}-byte limit",
            limits.max_frame_bytes
        )));
    }
    let mut body = vec![0u8; len];
    with_timeout(limits, "read", stream.read_exact(&mut body)).await?;
    Ok(body)
}

/// An authenticated, encrypted connection to one peer.
pub struct Channel {
    stream: TcpStream,
    session: Session,
    limits: Limits,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Channel({:?})", self.session)
    }
}

impl Channel {
    /// Connects to `address` and runs the handshake as initiator, expecting the responder to be
    /// `peer` (pinned: any other identity is refused).
    pub async fn connect(
        address: impl ToSocketAddrs,
        identity: &Identity,
        peer: PublicIdentity,
        limits: Limits,
    ) -> Result<Self> {
        let mut stream = with_timeout(&limits, "connect", TcpStream::connect(address)).await?;
        // Requests are small and latency-bound: do not wait to coalesce them (Nagle).
        stream
            .set_nodelay(true)
            .map_err(|e| Error::Transport(format!("TCP_NODELAY: {e}")))?;
        let handshake = Limits {
            max_frame_bytes: M2_BYTES,
            ..limits
        };
        let (initiator, m1) = Initiator::start(identity, peer);
        write_frame(&mut stream, &m1, &handshake).await?;
        let m2 = read_frame(&mut stream, &handshake).await?;
        let (session, m3) = initiator.finish(&m2)?;
        write_frame(&mut stream, &m3, &handshake).await?;
        Ok(Self {
            stream,
            session,
            limits,
        })
    }

    /// Runs the handshake as responder on an accepted connection; the initiator must be in
    /// `directory`.
    pub async fn accept(
        mut stream: TcpStream,
        identity: &Identity,
        directory: &Directory,
        limits: Limits,
    ) -> Result<Self> {
        stream
            .set_nodelay(true)
            .map_err(|e| Error::Transport(format!("TCP_NODELAY: {e}")))?;
        let handshake = Limits {
            max_frame_bytes: M1_BYTES.max(M3_BYTES),
            ..limits
        };
        let m1 = read_frame(&mut stream, &handshake).await?;
        let (responder, m2) = Responder::respond(identity, |id| directory.get(id).cloned(), &m1)?;
        write_frame(&mut stream, &m2, &limits).await?;
        let m3 = read_frame(&mut stream, &handshake).await?;
        let session = responder.finish(&m3)?;
        Ok(Self {
            stream,
            session,
            limits,
        })
    }

    /// The authenticated peer.
    pub fn peer(&self) -> IdentityId {
        self.session.peer()
    }

    /// Seals `plaintext` into the next frame without sending it (see [`Channel::write_sealed`]).
    pub fn seal(&mut self, plaintext: &[u8]) -> Result<Vec<u8>> {
        Ok(self.session.seal(plaintext)?)
    }

    /// Sends an already sealed frame as is. With [`Channel::seal`] this lets a caller send a
    /// frame twice or altered, which is how the tests show such frames are refused.
    pub async fn write_sealed(&mut self, frame: &[u8]) -> Result<()> {
        write_frame(&mut self.stream, frame, &self.limits).await
    }

    /// Seals and sends one message.
    pub async fn send_bytes(&mut self, plaintext: &[u8]) -> Result<()> {
        let frame = self.session.seal(plaintext)?;
        write_frame(&mut self.stream, &frame, &self.limits).await
    }

    /// Receives and opens one message.
    pub async fn recv_bytes(&mut self) -> Result<Vec<u8>> {
        let frame = read_frame(&mut self.stream, &self.limits).await?;
        Ok(self.session.open(&frame)?)
    }

    /// Sends one message as JSON.
    pub async fn send<T: Serialize>(&mut self, message: &T) -> Result<()> {
        self.send_bytes(&serde_json::to_vec(message)?).await
    }

    /// Receives one JSON message.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T> {
        let bytes = self.recv_bytes().await?;
        Ok(serde_json::from_slice(&bytes)?)
    }

    /// Sends a request and waits for its answer.
    pub async fn call<Q: Serialize, A: DeserializeOwned>(&mut self, request: &Q) -> Result<A> {
        self.send(request).await?;
        self.recv().await
    }

    /// Replaces the read/write deadline (e.g. for a DKG, which waits on other signers).
    pub fn set_io_timeout(&mut self, timeout: Duration) {
        self.limits.io_timeout = timeout;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    async fn pair(
        server_id: Identity,
        client_id: &Identity,
        expected_server: PublicIdentity,
    ) -> (Result<Channel>, Result<Channel>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let directory: Directory = [(client_id.id(), client_id.public())].into();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            Channel::accept(stream, &server_id, &directory, Limits::default()).await
        });
        let client = Channel::connect(address, client_id, expected_server, Limits::default()).await;
        (client, server.await.unwrap())
    }

    #[tokio::test]
    async fn messages_flow_and_bad_frames_end_the_session() {
        let (s, c) = (Identity::generate(), Identity::generate());
        let s_public = s.public();
        let (client, server) = pair(s, &c, s_public).await;
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        assert_eq!(server.peer(), c.id());
        client.send(&"hello".to_string()).await.unwrap();
        assert_eq!(server.recv::<String>().await.unwrap(), "hello");
        // A replayed frame: the same sealed bytes twice.
        let frame = client.seal(b"\"once\"").unwrap();
        client.write_sealed(&frame).await.unwrap();
        client.write_sealed(&frame).await.unwrap();
        assert_eq!(server.recv::<String>().await.unwrap(), "once");
        let err = server.recv::<String>().await.unwrap_err().to_string();
        assert!(err.contains("out of order"), "{err}");
        // An altered frame.
        let mut frame = client.seal(b"\"x\"").unwrap();
        frame[10] ^= 0x40;
        client.write_sealed(&frame).await.unwrap();
        let err = server.recv::<String>().await.unwrap_err().to_string();
        assert!(err.contains("authentication"), "{err}");
    }

    #[tokio::test]
    async fn a_wrong_identity_or_an_oversized_frame_is_refused() {
        let (s, c, other) = (
            Identity::generate(),
            Identity::generate(),
            Identity::generate(),
        );
        let (client, _server) = pair(s, &c, other.public()).await;
        let err = client.unwrap_err().to_string();
        assert!(err.contains("expected"), "{err}");
        // A length prefix over the limit is refused before reading the body.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let reader = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_frame(&mut stream, &Limits::default()).await
        });
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        let err = reader.await.unwrap().unwrap_err().to_string();
        assert!(err.contains("over the"), "{err}");
    }
}
