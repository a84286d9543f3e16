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

/// How long a polite client may wait while a greedy one is at work: well
/// above a loaded debug build's latency, and an order of magnitude under the
/// failure guarded (a client starved until its 30 s timeout).
const SERVED_SOON: Duration = Duration::from_secs(3);

/// A well-behaved client's request over its own connection, from an address
/// of its own (the greedy one's are bounded per address), timed.
async fn polite_request(port: u16) -> (u16, Duration) {
    let started = Instant::now();
    let response = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{port}/api/noauth/info"))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), started.elapsed())
}

/// The HTTP/2 stream limit keygate announces.
const STREAM_LIMIT: usize = 128;

/// keygate with `extra` TOML after its route, and the upstream.
async fn start(extra: &str) -> (Process, tempfile::TempDir, Upstream) {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    common::certificate_into(&dir.path().join("ca"), &data);
    let config = dir.path().join("keygate.toml");
    write_config(&config, &data, &upstream.url(), extra);
    (Process::spawn(&config, "info"), dir, upstream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_opened_and_never_read_cannot_starve_others_or_grow_memory() {
    // In-flight bounds that let every stream through, so that flow control
    // alone holds them (the bounds have tests of their own, in
    // `tests/held_requests.rs`).
    let (mut process, _dir, upstream) =
        start("[limits]\nmax_in_flight_per_connection = 128\nmax_in_flight_per_address = 1024\n")
            .await;
    let port = process.http;
    let pid = process.child.id();
    assert_eq!(polite_request(port).await.0, 200);
    let before = rss_kib(pid);

    // Four greedy connections, each opening as many streams as the limit
    // allows, every one asking for a 1 MiB answer and reading none of them:
    // the open streams are held by flow control.
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
            STREAM_LIMIT,
            "the server announces its stream limit"
        );
        for _ in 0..STREAM_LIMIT {
            send = tokio::time::timeout(Duration::from_secs(30), send.ready())
                .await
                .expect("a stream under the limit opens")
                .unwrap();
            let (response, _) = send
                .send_request(get(port, "/api/noauth/big"), true)
                .unwrap();
            held.push(response);
        }
    }
    assert_eq!(held.len(), 4 * STREAM_LIMIT, "greedy streams opened");
    // Every greedy stream is under way: the upstream has answered each.
    common::wait_until(
        "every greedy stream reached the upstream",
        Duration::from_secs(60),
        async || upstream.big_answers() >= 4 * STREAM_LIMIT,
    )
    .await;

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
    assert!(slowest < SERVED_SOON, "others waited {slowest:?}");
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
    let (mut process, _dir, _upstream) = start("").await;
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
    let flood = flood.await.unwrap();
    let after = rss_kib(pid);
    println!(
        "reset flood: {flood:?}; {served} polite requests meanwhile, the slowest {slowest:?}; \
         RSS {before} KiB before, {after} KiB after"
    );
    assert!(
        flood.cut_off,
        "the flooding connection was never cut off: {flood:?}"
    );
    // Its GOAWAY says why, when it was read before the connection closed.
    assert!(
        flood.goaway.is_none_or(|code| code == ENHANCE_YOUR_CALM),
        "the server said why: {flood:?}"
    );
    assert!(
        flood.sent < 50_000,
        "the flooding connection was cut off late: {flood:?}"
    );
    assert!(slowest < SERVED_SOON, "others waited {slowest:?}");
    assert!(after < before + 64 * 1024, "{before} KiB -> {after} KiB");
    assert_eq!(polite_request(port).await.0, 200);
    process.signal("TERM");
    let _ = process.child.wait();
}

/// The HTTP/2 error code of a GOAWAY for a peer that misbehaves.
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// How a rapid-reset flood ended.
#[derive(Debug)]
struct Flood {
    /// Pairs of HEADERS and RST_STREAM written.
    sent: u32,
    /// The server ended the connection (its side closed, or a write failed)
    /// before the flood ran out of streams or time.
    cut_off: bool,
    /// The error code of the server's GOAWAY, if it sent one.
    goaway: Option<u32>,
}

/// Reads the server's frames until it closes the connection; the error code
/// of the last GOAWAY among them.
async fn goaway_of(mut read: tokio::net::tcp::OwnedReadHalf) -> Option<u32> {
    use tokio::io::AsyncReadExt;
    let mut goaway = None;
    let mut header = [0u8; 9];
    while read.read_exact(&mut header).await.is_ok() {
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        if read.read_exact(&mut payload).await.is_err() {
            break;
        }
        if header[3] == 0x7 && len >= 8 {
            goaway = Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
        }
    }
    goaway
}

/// Sends up to `streams` pairs of HEADERS (`GET /api/noauth/info`) and
/// RST_STREAM (CANCEL) on one HTTP/2 connection, for at most 60 s, and says
/// how it ended.
async fn rapid_reset(port: u16, streams: u32) -> Flood {
    use tokio::io::AsyncWriteExt;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (read, mut write) = tcp.into_split();
    // Read whatever the server sends, so it never blocks on us.
    let reader = tokio::spawn(goaway_of(read));
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend_from_slice(&frame(0x4, 0, 0, &[])); // SETTINGS
    write.write_all(&preface).await.unwrap();
    // HPACK: :method GET (static 2), :scheme http (6), :path literal without indexing.
    let path = b"/api/noauth/info";
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    let started = Instant::now();
    let mut sent = 0;
    let mut write_failed = false;
    while sent < streams && started.elapsed() < Duration::from_secs(60) && !reader.is_finished() {
        let mut batch = Vec::with_capacity(100 * 64);
        for n in 0..100 {
            let id = 1 + 2 * (sent + n);
            batch.extend_from_slice(&frame(0x1, 0x5, id, &block)); // END_STREAM | END_HEADERS
            batch.extend_from_slice(&frame(0x3, 0, id, &8u32.to_be_bytes())); // CANCEL
        }
        if write.write_all(&batch).await.is_err() {
            write_failed = true;
            break;
        }
        sent += 100;
    }
    let cut_off = write_failed || reader.is_finished();
    let _ = write.shutdown().await;
    // After the server's close, its frames are read to the end; otherwise
    // the server still holds the connection and there is nothing to wait for.
    let goaway = if cut_off {
        tokio::time::timeout(Duration::from_secs(30), reader)
            .await
            .expect("the server's side of a connection it cut off ends")
            .unwrap()
    } else {
        reader.abort();
        None
    };
    Flood {
        sent,
        cut_off,
        goaway,
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}
