//! The client stream handed to the HTTP server: the bytes already read
//! while looking at the first request head come first, and every byte
//! moved either way counts as activity for the idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::attempt::Activity;

#[derive(Debug)]
pub(crate) struct Prefixed<S> {
    prefix: Bytes,
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Prefixed<S> {
    pub fn new(prefix: impl Into<Bytes>, inner: S, activity: Arc<Activity>) -> Self {
        Prefixed {
            prefix: prefix.into(),
            inner,
            activity,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.has_remaining() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(this.prefix.get(..n).unwrap_or_default());
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn prefix_then_inner() {
        let (a, mut b) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::new());
        let mut s = Prefixed::new(&b"head"[..], a, activity.clone());
        b.write_all(b" and more").await.unwrap();
        drop(b);
        let mut small = [0u8; 3];
        assert_eq!(s.read(&mut small).await.unwrap(), 3);
        assert_eq!(&small, b"hea");
        let mut rest = String::new();
        s.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "d and more");
    }

    #[tokio::test]
    async fn writes_and_reads_are_activity() {
        use std::time::Duration;
        let (a, mut b) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::new());
        let mut s = Prefixed::new(Bytes::new(), a, activity.clone());
        let t0 = activity.last();
        tokio::time::sleep(Duration::from_millis(30)).await;
        s.write_all(b"x").await.unwrap();
        let t1 = activity.last();
        assert!(t1 >= t0 + Duration::from_millis(25), "{t0:?} {t1:?}");
        tokio::time::sleep(Duration::from_millis(30)).await;
        b.write_all(b"y").await.unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).await.unwrap();
        assert!(activity.last() >= t1 + Duration::from_millis(25));
    }
}
