//! An upstream connection's bytes: plain TCP, or TLS over TCP to an
//! `https://` upstream; and [`Endpoint::open`], the one way every upstream
//! connection is opened (requests on both drivers, WebSocket upgrades, the
//! API browser's documents).
//!
//! A plain stream is read and written as the socket itself, a match on the
//! kind away (no box, no call through a pointer); a TLS stream is boxed, as
//! its state is large and moving it would copy it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::uri::Authority;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::config::UpstreamUrl;
use crate::tls_client::Connector;

/// The bytes of one upstream connection.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// Nothing is waiting to be read and the upstream has not closed:
    /// ready for a request. Asked without waiting, of what the reactor
    /// recorded: a plain socket with nothing recorded costs no system call.
    /// Over TLS, records that arrived are processed (a session ticket is
    /// no answer), and a `close_notify` or FIN reads as closed.
    pub fn idle_and_open(&mut self) -> bool {
        match self {
            Stream::Plain(tcp) => matches!(
                tcp.try_read(&mut [0u8; 1]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock
            ),
            Stream::Tls(tls) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut byte = [0u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                Pin::new(&mut **tls)
                    .poll_read(&mut cx, &mut buf)
                    .is_pending()
            }
        }
    }

    /// Over TLS: writes out what the TLS layer still holds. A plain
    /// socket holds nothing.
    pub async fn flush_tls(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(tls) => tokio::io::AsyncWriteExt::flush(&mut **tls).await,
        }
    }
}

impl AsyncRead for Stream {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_write_vectored(cx, bufs),
        }
    }

    #[inline]
    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(&mut **tls).poll_shutdown(cx),
        }
    }
}

/// Where an upstream connection goes: host and port, and the TLS spoken
/// there (none for `http://`).
#[derive(Clone)]
pub struct Endpoint {
    key: EndpointKey,
    port: u16,
    tls: Option<Connector>,
}

/// What a pool keeps an endpoint's connections by: its authority and its
/// TLS (the [`Connector`]'s id, 0 for none). A connection made with one
/// route's client certificate never serves another's, and one made before
/// a reload never serves after it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EndpointKey {
    authority: Authority,
    tls: u64,
}

/// Why no connection was opened.
#[derive(Debug)]
pub enum OpenError {
    /// The TCP connection was refused, unreachable or timed out.
    Connect(io::Error),
    /// The TLS handshake failed or timed out.
    Handshake(io::Error),
}

impl Endpoint {
    /// The endpoint of `url`, with `tls` when it is `https://` (`None`
    /// there: the configuration built none, which it always does).
    pub fn of(url: &UpstreamUrl, tls: Option<&Connector>) -> Endpoint {
        Endpoint::new(url.authority().clone(), url.is_https(), tls)
    }

    /// The endpoint at `authority`, over `tls` when `https`.
    pub fn new(authority: Authority, https: bool, tls: Option<&Connector>) -> Endpoint {
        let tls = if https { tls.cloned() } else { None };
        Endpoint {
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            key: EndpointKey {
                authority,
                tls: tls.as_ref().map_or(0, Connector::id),
            },
            tls,
        }
    }

    pub fn authority(&self) -> &Authority {
        &self.key.authority
    }

    /// What pools keep its connections by.
    pub fn key(&self) -> &EndpointKey {
        &self.key
    }

    /// Spoken to over TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The host, without the brackets of an IPv6 address.
    pub fn host(&self) -> &str {
        let host = self.key.authority.host();
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// A new connection: TCP, then the TLS handshake when there is TLS,
    /// both within `timeout`.
    pub async fn open(&self, timeout: Duration) -> Result<Stream, OpenError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let tcp = tokio::time::timeout_at(deadline, TcpStream::connect((self.host(), self.port)))
            .await
            .map_err(|_| OpenError::Connect(timed_out("connect timed out")))?
            .map_err(OpenError::Connect)?;
        tcp.set_nodelay(true).map_err(OpenError::Connect)?;
        let Some(tls) = &self.tls else {
            return Ok(Stream::Plain(tcp));
        };
        match tokio::time::timeout_at(deadline, tls.connect(self.host(), tcp)).await {
            Ok(Ok(stream)) => Ok(Stream::Tls(Box::new(stream))),
            Ok(Err(error)) => Err(OpenError::Handshake(error)),
            Err(_) => Err(OpenError::Handshake(timed_out(
                "the TLS handshake timed out",
            ))),
        }
    }
}

fn timed_out(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

/// The reason a TLS handshake failed, for a log line: rustls's own error
/// when there is one (an unknown issuer, a certificate the upstream
/// refused), else the I/O error.
pub fn handshake_reason(error: &io::Error) -> String {
    tls_reason(error).unwrap_or_else(|| error.to_string())
}

/// The TLS failure `error` is or wraps as an I/O error, if it is one.
pub fn tls_reason(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let tls = match error.downcast_ref::<io::Error>() {
        Some(io) => io.get_ref()?.downcast_ref::<rustls::Error>()?,
        None => error.downcast_ref::<rustls::Error>()?,
    };
    Some(tls.to_string())
}
