//! Connection limits against the real server: silent, idle, trickling and dead
//! peers, one address opening many connections, and the admin listener. Every
//! deadline is short here, so each test takes a second or two.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Gateway, Upstream};
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A route to the upstream's two-second answer that may take that long.
const SLOW_ROUTE: &str = r#"
[[route]]
name = "slow_ok"
prefix = "/api/noauth/slow"
upstreams = ["UPSTREAM"]
public = true
request_timeout = "5s"
"#;

async fn start(limits: &str) -> (Upstream, Gateway) {
    let upstream = Upstream::start().await;
    let extra = format!(
        "{limits}\n{}",
        SLOW_ROUTE.replace("UPSTREAM", &upstream.url())
    );
    let gw = Gateway::start(&upstream.url(), &extra).await;
    (upstream, gw)
}

/// Reads until the peer closes (end of stream or reset); returns what arrived
/// and how long the close took. Fails if it stays open for `within`.
async fn until_closed<S: AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + within).into(), stream.read(&mut buf)).await {
            Err(_) => panic!(
                "connection still open after {within:?}; got {:?}",
                String::from_utf8_lossy(&out)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => return (out, started.elapsed()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one HTTP/1.1 response with a Content-Length body.
async fn read_response(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                return (head, data[end + 4..end + 4 + length].to_vec());
            }
        }
        let n = tokio::time::timeout_at(deadline.into(), stream.read(&mut buf))
            .await
            .expect("a response in time")
            .expect("readable");
        assert!(
            n > 0,
            "closed before a full response: {:?}",
            String::from_utf8_lossy(&data)
        );
        data.extend_from_slice(&buf[..n]);
    }
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

/// A TCP connection from a chosen loopback address (all of 127/8 is local).
async fn connect_from(local: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(local, 0))?;
    socket.connect(to).await
}

/// The value of `keygate_connections_closed_total` for a listener and reason.
async fn closed_total(gw: &Gateway, listener: &str, reason: &str) -> u64 {
    let prefix =
        format!(r#"keygate_connections_closed_total{{listener="{listener}",reason="{reason}"}} "#);
    gw.metrics()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits until the counter reaches `at_least` (the count follows the close).
async fn expect_closed_total(gw: &Gateway, listener: &str, reason: &str, at_least: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = closed_total(gw, listener, reason).await;
        if now >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "keygate_connections_closed_total{{listener={listener:?},reason={reason:?}}} is {now}, expected {at_least}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn silent_connection_is_closed_before_protocol_detection() {
    let (_upstream, gw) =
        start("[limits]\nheader_read_timeout = \"700ms\"\ntls_handshake_timeout = \"700ms\"\n")
            .await;
    let http = gw.running.http.unwrap();

    // Nothing at all.
    let mut silent = TcpStream::connect(http).await.unwrap();
    let (got, took) = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(got.is_empty());
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );

    // Part of the HTTP/2 preface: the protocol is never decided.
    let mut partial = TcpStream::connect(http).await.unwrap();
    partial.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    until_closed(&mut partial, Duration::from_secs(5)).await;
    expect_closed_total(&gw, "http", "head_timeout", 2).await;

    // TLS: the handshake completes, then nothing.
    let https = gw.running.https.unwrap();
    let tcp = TcpStream::connect(https).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = common::tls_connector(&gw.ca_pem)
        .connect(name, tcp)
        .await
        .unwrap();
    let (got, took) = until_closed(&mut tls, Duration::from_secs(5)).await;
    assert!(got.is_empty());
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );
    expect_closed_total(&gw, "https", "head_timeout", 1).await;

    // No TLS handshake at all: the handshake timeout closes it.
    let mut no_hello = TcpStream::connect(https).await.unwrap();
    until_closed(&mut no_hello, Duration::from_secs(5)).await;
    expect_closed_total(&gw, "https", "tls_handshake_timeout", 1).await;
}

#[tokio::test]
async fn idle_http2_connection_is_closed() {
    let (upstream, gw) = start("[limits]\nidle_timeout = \"800ms\"\n").await;
    let http = gw.running.http.unwrap();
    let tcp = TcpStream::connect(http).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let request = Request::get(format!("http://{http}/api/noauth/ping"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), http::Version::HTTP_2);
    response.into_body().collect().await.unwrap();
    let idle_from = Instant::now();
    assert_eq!(upstream.requests().len(), 1);

    // The server closes with GOAWAY: the client connection ends cleanly.
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the idle HTTP/2 connection was closed");
    ended.unwrap().unwrap();
    let took = idle_from.elapsed();
    assert!(
        took >= Duration::from_millis(600),
        "closed too early: {took:?}"
    );
    expect_closed_total(&gw, "http", "idle", 1).await;
}

#[tokio::test]
async fn idle_keep_alive_http1_connection_is_closed() {
    // Our idle timeout, shorter than header_read_timeout.
    let (_upstream, gw) =
        start("[limits]\nidle_timeout = \"800ms\"\nheader_read_timeout = \"10s\"\n").await;
    let mut stream = TcpStream::connect(gw.running.http.unwrap()).await.unwrap();
    for _ in 0..2 {
        stream
            .write_all(get("/api/noauth/ping").as_bytes())
            .await
            .unwrap();
        let (head, _) = read_response(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    }
    let (got, took) = until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(got.is_empty(), "nothing is sent on an idle close");
    assert!(
        took >= Duration::from_millis(600),
        "closed too early: {took:?}"
    );
    expect_closed_total(&gw, "http", "idle", 1).await;
}

/// hyper starts header_read_timeout again as soon as a response is written: an
/// idle keep-alive HTTP/1.1 connection, and one trickling its next request
/// head, are closed by it even when idle_timeout is longer.
#[tokio::test]
async fn keep_alive_http1_connection_waits_no_longer_than_header_read_timeout() {
    let (_upstream, gw) =
        start("[limits]\nidle_timeout = \"30s\"\nheader_read_timeout = \"800ms\"\n").await;
    let http = gw.running.http.unwrap();

    let mut idle = TcpStream::connect(http).await.unwrap();
    idle.write_all(get("/api/noauth/ping").as_bytes())
        .await
        .unwrap();
    read_response(&mut idle).await;
    let (_, took) = until_closed(&mut idle, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(600),
        "closed too early: {took:?}"
    );
    expect_closed_total(&gw, "http", "idle", 1).await;

    let mut trickle = TcpStream::connect(http).await.unwrap();
    trickle
        .write_all(get("/api/noauth/ping").as_bytes())
        .await
        .unwrap();
    read_response(&mut trickle).await;
    let started = Instant::now();
    let second = b"GET /api/noauth/ping HTTP/1.1\r\nHost: localhost\r\n";
    for byte in second {
        if trickle.write_all(&[*byte]).await.is_err() {
            break;
        }
        if started.elapsed() > Duration::from_secs(5) {
            panic!("a trickled request head kept the connection open");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    until_closed(&mut trickle, Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    expect_closed_total(&gw, "http", "head_timeout", 1).await;
}

#[tokio::test]
async fn trickled_body_to_an_owned_endpoint_gets_408() {
    let (_upstream, gw) = start("[limits]\nbody_read_timeout = \"800ms\"\n").await;
    let http = gw.running.http.unwrap();

    // HTTP/1.1: one byte every 300 ms of a 100-byte login body.
    let mut stream = TcpStream::connect(http).await.unwrap();
    let head = "POST /api/auth/login HTTP/1.1\r\nHost: localhost\r\n\
                Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{";
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = stream.into_split();
    let trickler = tokio::spawn(async move {
        while writer.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let (got, _) = until_closed(&mut reader, Duration::from_secs(5)).await;
    trickler.abort();
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    let body = &text[text.find("\r\n\r\n").unwrap() + 4..];
    let json: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(json["status"], 408);
    assert_eq!(json["errorCode"], 31);
    assert!(json["timestamp"].as_u64().is_some());
    assert!(
        took >= Duration::from_millis(600) && took < Duration::from_secs(3),
        "{took:?}"
    );
    expect_closed_total(&gw, "http", "body_timeout", 1).await;

    // HTTP/2: the stream gets the 408, the connection a GOAWAY.
    let tcp = TcpStream::connect(http).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let request = Request::post(format!("http://{http}/api/auth/login"))
        .header("content-type", "application/json")
        .body(Trickle(rx))
        .unwrap();
    let feeder = tokio::spawn(async move {
        while tx.send(Bytes::from_static(b" ")).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 408);
    assert!(response.headers().get("connection").is_none());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (json["status"].as_u64(), json["errorCode"].as_u64()),
        (Some(408), Some(31))
    );
    // The client keeps its side open: only the server's GOAWAY ends it.
    let ended = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the HTTP/2 connection was closed after the 408");
    assert!(ended.is_ok());
    assert!(sender.is_closed());
    feeder.abort();
    expect_closed_total(&gw, "http", "body_timeout", 2).await;
}

/// A request body fed from a channel, one chunk at a time.
struct Trickle(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Trickle {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let (_upstream, gw) = start(
        "[listen]\nmax_connections_per_address = 3\n[limits]\nidle_timeout = \"30s\"\nheader_read_timeout = \"30s\"\n",
    )
    .await;
    let http = gw.running.http.unwrap();
    let admin = gw.running.admin.unwrap();
    let greedy: IpAddr = "127.0.0.2".parse().unwrap();

    // Three admitted connections, each proven by a served request.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut stream = connect_from(greedy, http).await.unwrap();
        stream
            .write_all(get("/api/noauth/ping").as_bytes())
            .await
            .unwrap();
        let (head, _) = read_response(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        held.push(stream);
    }

    // A fourth from the same address to a client listener is closed at once;
    // the admin listener counts addresses apart, so probes still answer.
    let mut over = connect_from(greedy, http).await.unwrap();
    let _ = over.write_all(get("/api/noauth/ping").as_bytes()).await;
    let (got, took) = until_closed(&mut over, Duration::from_secs(5)).await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    assert!(took < Duration::from_secs(3), "{took:?}");
    let mut probe = connect_from(greedy, admin).await.unwrap();
    probe.write_all(get("/healthz").as_bytes()).await.unwrap();
    let (head, _) = read_response(&mut probe).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    expect_closed_total(&gw, "http", "per_address_cap", 1).await;
    expect_closed_total(&gw, "admin", "per_address_cap", 0).await;

    // Everyone else is still served.
    let response = gw
        .client()
        .get(gw.https("/api/noauth/ping"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    // Closing one frees its place again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut stream = connect_from(greedy, http).await.unwrap();
        let _ = stream.write_all(get("/api/noauth/ping").as_bytes()).await;
        let (got, _) = until_closed_or_response(&mut stream).await;
        if got.starts_with(b"HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the place was not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A served response's first bytes, or nothing when the connection is closed.
async fn until_closed_or_response(stream: &mut TcpStream) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
        Ok(Ok(n)) => (buf[..n].to_vec(), started.elapsed()),
        _ => (Vec::new(), started.elapsed()),
    }
}

#[tokio::test]
async fn silent_connections_to_the_admin_listener_are_closed() {
    let (_upstream, gw) = start("[limits]\nheader_read_timeout = \"700ms\"\n").await;
    let admin = gw.running.admin.unwrap();
    let mut silent = TcpStream::connect(admin).await.unwrap();
    let mut slow_head = TcpStream::connect(admin).await.unwrap();
    slow_head
        .write_all(b"GET /metrics HTTP/1.1\r\n")
        .await
        .unwrap();
    let (got, took) = until_closed(&mut silent, Duration::from_secs(5)).await;
    assert!(got.is_empty());
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );
    until_closed(&mut slow_head, Duration::from_secs(5)).await;
    expect_closed_total(&gw, "admin", "head_timeout", 2).await;
    let health = reqwest::get(gw.admin("/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn slow_upstream_response_is_not_cut_by_the_idle_timeout() {
    let (_upstream, gw) = start("[limits]\nidle_timeout = \"500ms\"\n").await;
    let client = gw.client();
    // Plain HTTP/1.1, and HTTP/2 negotiated over TLS.
    for (url, version, listener) in [
        (gw.http("/api/noauth/slow"), http::Version::HTTP_11, "http"),
        (gw.https("/api/noauth/slow"), http::Version::HTTP_2, "https"),
    ] {
        let started = Instant::now();
        let response = client.get(url).send().await.unwrap();
        assert_eq!(response.version(), version);
        assert_eq!(response.status(), 200, "{version:?}");
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["path"], "/api/noauth/slow");
        assert!(started.elapsed() >= Duration::from_secs(2));
        // Idle only from here on: the connection may close now, not before.
        assert_eq!(closed_total(&gw, listener, "idle").await, 0, "{version:?}");
    }
}

/// A peer that completes the HTTP/2 handshake, asks for something slow and
/// then never answers again: keep-alive pings find it dead.
#[tokio::test]
async fn dead_http2_peer_is_dropped_by_keep_alive_pings() {
    let (_upstream, gw) = start(
        "[limits]\nidle_timeout = \"30s\"\nhttp2_keep_alive_interval = \"300ms\"\nhttp2_keep_alive_timeout = \"300ms\"\n",
    )
    .await;
    let http = gw.running.http.unwrap();
    let mut stream = TcpStream::connect(http).await.unwrap();
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]); // empty SETTINGS
    // HEADERS, END_STREAM | END_HEADERS, stream 1: GET
    // http://<authority>/api/noauth/slow?ms=30000, answered after 30 s.
    let authority = http.to_string();
    let path = "/api/noauth/slow?ms=30000";
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    block.push(0x04); // :path, literal without indexing
    block.push(path.len() as u8);
    block.extend_from_slice(path.as_bytes());
    block.push(0x01); // :authority, literal without indexing
    block.push(authority.len() as u8);
    block.extend_from_slice(authority.as_bytes());
    let len = block.len() as u32;
    hello.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, 0x1, 0x5]);
    hello.extend_from_slice(&1u32.to_be_bytes());
    hello.extend_from_slice(&block);
    stream.write_all(&hello).await.unwrap();
    let started = Instant::now();
    // Read (never answering PINGs) until the server gives up on us: after
    // 600 ms of pings, an order of magnitude before the slow answer.
    let (_, took) = until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(3),
        "closed by the pings, before the slow answer: {:?}",
        started.elapsed()
    );
    expect_closed_total(&gw, "http", "keep_alive_timeout", 1).await;
}
