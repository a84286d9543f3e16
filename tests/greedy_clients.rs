//! Greedy HTTP/2 clients: one that opens streams and never reads them, one
//! that floods resets. keygate keeps serving everyone else, and its memory
//! stays bounded. Slow heads, slow bodies and idle connections are guarded in
//! `tests/connections.rs`.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Process, Upstream, write_config};
use http::Request;

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

async fn h2c(port: u16) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

fn get(port: u16, path: &str) -> Request<()> {
    Request::get(format!("http://127.0.0.1:{port}{path}"))
        .body(())
        .unwrap()
}

/// A well-behaved client's request over its own connection, from an address
/// of its own (the greedy one's are bounded per address), timed.
async fn polite_request(port: u16) -> (u16, Duration) {
    let started = Instant::now();
    let response = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{port}/api/noauth/info"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), started.elapsed())
}

async fn start() -> (Process, tempfile::TempDir, Upstream) {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    common::certificate_into(&dir.path().join("ca"), &data);
    let config = dir.path().join("keygate.toml");
    write_config(&config, &data, &upstream.url(), "");
    (Process::spawn(&config, "info"), dir, upstream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_opened_and_never_read_cannot_starve_others_or_grow_memory() {
    let (mut process, _dir, _upstream) = start().await;
    let port = process.http;
    let pid = process.child.id();
    assert_eq!(polite_request(port).await.0, 200);
    let before = rss_kib(pid);

    // Four greedy connections, each asking for 300 MiB-sized answers and
    // reading none of them: streams beyond the limit wait, the ones open are
    // held by flow control.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut send = h2c(port).await.ready().await.unwrap();
        // Once one answer arrived, the server's settings have too.
        let (first, _) = send
            .send_request(get(port, "/api/noauth/info"), true)
            .unwrap();
        first.await.unwrap();
        send = send.ready().await.unwrap();
        assert_eq!(
            send.current_max_send_streams(),
            128,
            "the server announces its stream limit"
        );
        for _ in 0..300 {
            match tokio::time::timeout(Duration::from_millis(300), send.clone().ready()).await {
                Ok(Ok(ready)) => send = ready,
                _ => break,
            }
            match send.send_request(get(port, "/api/noauth/big"), true) {
                Ok((response, _)) => held.push(response),
                Err(_) => break,
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let (status, took) = polite_request(port).await;
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    let during = rss_kib(pid);
    println!(
        "greedy HTTP/2: {} streams asked for 1 MiB each and unread; polite requests took at most {slowest:?}; \
         RSS {before} KiB before, {during} KiB during",
        held.len()
    );
    assert!(
        slowest < Duration::from_millis(500),
        "others waited {slowest:?}"
    );
    assert!(
        during < before + 96 * 1024,
        "memory grew from {before} KiB to {during} KiB for unread streams"
    );
    drop(held);
    process.signal("TERM");
    let _ = process.child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_reset_flood_is_cut_off_while_others_are_served() {
    let (mut process, _dir, _upstream) = start().await;
    let port = process.http;
    let pid = process.child.id();
    let before = rss_kib(pid);

    // Open and at once cancel streams, as fast as the connection allows (the
    // "rapid reset" pattern), written as raw frames so that every HEADERS
    // reaches the server before its RST_STREAM.
    let flood = tokio::spawn(rapid_reset(port, 50_000));
    let mut slowest = Duration::ZERO;
    let mut served = 0;
    while served < 20 {
        let (status, took) = polite_request(port).await;
        assert_eq!(status, 200);
        slowest = slowest.max(took);
        served += 1;
    }
    let sent = flood.await.unwrap();
    let after = rss_kib(pid);
    println!(
        "reset flood: the connection ended after {sent} streams opened and cancelled were written; \
         {served} polite requests meanwhile, the slowest {slowest:?}; RSS {before} KiB before, {after} KiB after"
    );
    assert!(
        sent < 50_000,
        "the flooding connection was never cut off ({sent} resets)"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "others waited {slowest:?}"
    );
    assert!(after < before + 64 * 1024, "{before} KiB -> {after} KiB");
    assert_eq!(polite_request(port).await.0, 200);
    process.signal("TERM");
    let _ = process.child.wait();
}

/// Sends up to `streams` pairs of HEADERS (`GET /api/noauth/info`) and
/// RST_STREAM (CANCEL) on one HTTP/2 connection, for at most 5 s; returns how
/// many pairs were written before the server closed the connection.
async fn rapid_reset(port: u16, streams: u32) -> u32 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut read, mut write) = tcp.into_split();
    // Read and discard whatever the server sends, so it never blocks on us.
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while matches!(read.read(&mut buf).await, Ok(n) if n > 0) {}
    });
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&frame(0x4, 0, 0, &[])); // SETTINGS
    write.write_all(&preface).await.unwrap();
    // HPACK: :method GET (static 2), :scheme http (6), :path literal without indexing.
    let path = b"/api/noauth/info";
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    let started = Instant::now();
    let mut sent = 0;
    while sent < streams && started.elapsed() < Duration::from_secs(5) && !reader.is_finished() {
        let mut batch = Vec::with_capacity(100 * 64);
        for n in 0..100 {
            let id = 1 + 2 * (sent + n);
            batch.extend_from_slice(&frame(0x1, 0x5, id, &block)); // END_STREAM | END_HEADERS
            batch.extend_from_slice(&frame(0x3, 0, id, &8u32.to_be_bytes())); // CANCEL
        }
        if write.write_all(&batch).await.is_err() {
            break;
        }
        sent += 100;
    }
    let _ = write.shutdown().await;
    reader.abort();
    sent
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}
