//! A request body that must keep a pace: after a grace period it must have delivered at least a
//! minimum number of bytes per second, or reading it fails.
//!
//! Why: a handler holds a connection slot and a shed slot while it reads its body, so a client
//! that trickles a large body a byte at a time would hold both for as long as it likes. The
//! header read has its own timeout (hyper's); this bounds the body the same way, and scales with
//! its size instead of cutting off honest large uploads: a body of `n` bytes may take
//! `grace + n / min_bytes_per_s`.

use hyper::body::{Body, Bytes, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The pace a body must keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// How long the first bytes may take.
    pub grace: Duration,
    /// Bytes a second the body must average after the grace (0: no bound).
    pub min_bytes_per_s: u64,
}

/// Reading the body failed: it fell behind its [`Pace`].
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived slower than {min_bytes_per_s} bytes/s (after {grace_s} s)")]
pub struct TooSlow {
    min_bytes_per_s: u64,
    grace_s: u64,
}

/// `B` read at no less than a [`Pace`].
pub struct MinRate<B> {
    inner: B,
    pace: Pace,
    started: Instant,
    read: u64,
    deadline: Pin<Box<Sleep>>,
}

impl<B> MinRate<B> {
    /// `inner`, whose pace counts from now.
    pub fn new(inner: B, pace: Pace) -> Self {
        let started = Instant::now();
        Self {
            inner,
            pace,
            started,
            read: 0,
            deadline: Box::pin(tokio::time::sleep_until(started + pace.grace)),
        }
    }

    /// When the body must have delivered more than it has: the grace, plus the time the bytes
    /// read so far buy at the minimum rate.
    fn due(&self) -> Instant {
        let bought = Duration::from_secs_f64(self.read as f64 / self.pace.min_bytes_per_s as f64);
        self.started + self.pace.grace + bought
    }
}

impl<B> Body for MinRate<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && this.pace.min_bytes_per_s > 0
                {
                    this.read += data.len() as u64;
                    let due = this.due();
                    this.deadline.as_mut().reset(due);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.pace.min_bytes_per_s > 0 && this.deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Box::new(TooSlow {
                        min_bytes_per_s: this.pace.min_bytes_per_s,
                        grace_s: this.pace.grace.as_secs(),
                    }))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body that yields `chunks` of ten bytes, one every `every`.
    fn trickle(
        chunks: usize,
        every: Duration,
    ) -> http_body_util::StreamBody<
        tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, std::convert::Infallible>>,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            for _ in 0..chunks {
                tokio::time::sleep(every).await;
                let chunk = Frame::data(Bytes::from_static(b"0123456789"));
                if tx.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    #[tokio::test]
    async fn a_body_keeping_its_pace_is_read_whole_and_a_trickle_fails() {
        let pace = Pace {
            grace: Duration::from_millis(300),
            min_bytes_per_s: 20,
        };
        // 100 bytes a second, five times the pace: read whole.
        let steady = MinRate::new(trickle(5, Duration::from_millis(100)), pace);
        let bytes = steady.collect().await.unwrap().to_bytes();
        assert_eq!(bytes.len(), 50);
        // 10 bytes every 2 s: fails once the grace is spent, not after the whole body.
        let slow = MinRate::new(trickle(5, Duration::from_secs(2)), pace);
        let started = Instant::now();
        let err = slow.collect().await.unwrap_err();
        assert!(err.to_string().contains("slower than 20 bytes/s"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
