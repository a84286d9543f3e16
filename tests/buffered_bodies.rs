//! Request buffering: a small proxied body is read whole, at its pace,
//! before any upstream connection or in-flight slot is taken, so that
//! bodies trickled from one address hold nothing upstream while they
//! trickle; a body over `limits.buffered_body_bytes` streams as before; a
//! body slower than the pace rules is cut with the usual 408.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, WIRES};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// One request as the upstream saw it once its body ended.
#[derive(Debug, Clone)]
struct Seen {
    content_length: Option<String>,
    chunked: bool,
    body_len: usize,
}

/// An upstream that counts its open connections (and the most it had), the
/// request heads that reached it, and the body bytes as they arrive, and
/// answers each request with its body's length once the body has ended.
#[derive(Clone)]
struct StreamingUpstream {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    heads: Arc<AtomicUsize>,
    body_bytes: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl StreamingUpstream {
    async fn start() -> StreamingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = StreamingUpstream {
            addr: listener.local_addr().unwrap(),
            open: Arc::default(),
            peak: Arc::default(),
            heads: Arc::default(),
            body_bytes: Arc::default(),
            seen: Arc::default(),
        };
        let serving = upstream.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let now = serving.open.fetch_add(1, Ordering::SeqCst) + 1;
                serving.peak.fetch_max(now, Ordering::SeqCst);
                let upstream = serving.clone();
                tokio::spawn(async move {
                    let answering = upstream.clone();
                    let service = service_fn(move |req: Request<Incoming>| {
                        let upstream = answering.clone();
                        async move { Ok::<_, Infallible>(upstream.answer(req).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    upstream.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        upstream
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        let (parts, mut body) = req.into_parts();
        let mut body_len = 0;
        while let Some(Ok(frame)) = body.frame().await {
            let len = frame.data_ref().map_or(0, Bytes::len);
            body_len += len;
            self.body_bytes.fetch_add(len, Ordering::SeqCst);
        }
        self.seen.lock().unwrap().push(Seen {
            content_length: parts
                .headers
                .get("content-length")
                .map(|v| v.to_str().unwrap().to_owned()),
            chunked: parts.headers.contains_key("transfer-encoding"),
            body_len,
        });
        Response::new(Full::new(Bytes::from(format!("{body_len}\n"))))
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    fn heads(&self) -> usize {
        self.heads.load(Ordering::SeqCst)
    }

    fn body_bytes(&self) -> usize {
        self.body_bytes.load(Ordering::SeqCst)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn h2c(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send.ready().await.unwrap()
}

/// The sum of the samples whose line starts with `line_start`.
fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(line_start))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// A request body fed by the test, piece by piece: the sender, and the body
/// for reqwest.
fn fed_body() -> (tokio::sync::mpsc::Sender<Bytes>, reqwest::Body) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
    });
    (tx, reqwest::Body::wrap_stream(stream))
}

/// The size of each trickled body: well under the buffering limit.
const SMALL: usize = 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_bodies_trickled_over_http2_hold_no_upstream_connection_until_whole() {
    let upstream = StreamingUpstream::start().await;
    // The default bounds: 32 in flight per connection, 128 per address.
    let gateway = Gateway::start(&upstream.url(), "").await;
    let http = gateway.running.http.unwrap();

    // Four connections of 100 streams each, from one address: every body
    // small, half of them of a declared length, half of none, each sent
    // half and then held.
    let half = Bytes::from(vec![b'x'; SMALL / 2]);
    let mut connections = Vec::new();
    for _ in 0..4 {
        let mut connection = h2c(http).await;
        let mut streams = Vec::new();
        for i in 0..100 {
            connection = connection.ready().await.unwrap();
            let mut request = Request::post(format!("http://{http}/api/noauth/upload"));
            if i % 2 == 0 {
                request = request.header("content-length", SMALL.to_string());
            }
            let (response, mut body) = connection
                .send_request(request.body(()).unwrap(), false)
                .unwrap();
            body.send_data(half.clone(), false).unwrap();
            streams.push((response, body));
        }
        connections.push((connection, streams));
    }

    // While the bodies trickle, nothing reaches the upstream: no connection
    // opened, no request head sent. Long enough for every first half to
    // have been read (well within the 10 s pace bound).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let metrics = gateway.metrics().await;
    println!(
        "400 trickled small bodies from one address: {} upstream connections open \
         (peak {}), {} request heads upstream",
        upstream.open(),
        upstream.peak(),
        upstream.heads()
    );
    assert_eq!(upstream.peak(), 0, "no upstream connection while trickling");
    assert_eq!(upstream.heads(), 0, "no request forwarded while trickling");
    assert_eq!(
        metric(&metrics, "keygate_in_flight_refused_total{"),
        0.0,
        "no in-flight slot taken, so none refused: {metrics}"
    );

    // Each body completes: its request is forwarded then, whole. Twenty at
    // a time on each connection, within the in-flight bounds.
    let finishing = connections.into_iter().map(|(connection, streams)| {
        let half = half.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut streams = streams.into_iter();
            loop {
                let batch: Vec<_> = streams.by_ref().take(20).collect();
                if batch.is_empty() {
                    break;
                }
                let mut responses = Vec::new();
                for (response, mut body) in batch {
                    body.send_data(half.clone(), true).unwrap();
                    responses.push(response);
                }
                for response in responses {
                    let response = tokio::time::timeout(Duration::from_secs(20), response)
                        .await
                        .expect("answered once whole")
                        .unwrap();
                    let status = response.status();
                    let mut body = response.into_body();
                    let mut text = Vec::new();
                    while let Some(chunk) = body.data().await {
                        let chunk = chunk.unwrap();
                        let _ = body.flow_control().release_capacity(chunk.len());
                        text.extend_from_slice(&chunk);
                    }
                    answers.push((status, String::from_utf8(text).unwrap()));
                }
            }
            drop(connection);
            answers
        })
    });
    let mut answered = 0;
    for answers in futures_util::future::join_all(finishing).await {
        for (status, text) in answers.unwrap() {
            assert_eq!(status, 200, "{text}");
            assert_eq!(text, format!("{SMALL}\n"), "the whole body went upstream");
            answered += 1;
        }
    }
    assert_eq!(answered, 400, "every request forwarded once whole");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 400);
    for request in &seen {
        assert_eq!(request.body_len, SMALL);
        assert_eq!(
            request.content_length.as_deref(),
            Some("1000"),
            "a body read whole goes with its length, declared or not: {request:?}"
        );
        assert!(!request.chunked, "{request:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_a_connections_buffering_budget_stream_as_large_ones_do() {
    let upstream = StreamingUpstream::start().await;
    let gateway = Gateway::start(&upstream.url(), "").await;
    let http = gateway.running.http.unwrap();
    // 25 bodies of 60,000 bytes on one connection, each under the 64 KiB
    // limit, 50,000 of each sent and held: 1.25 MB together, past the
    // connection's 1 MiB budget for bodies being read whole.
    const STREAMS: usize = 25;
    const BODY: usize = 60_000;
    const SENT: usize = 50_000;
    let mut connection = h2c(http).await;
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        connection = connection.ready().await.unwrap();
        let request = Request::post(format!("http://{http}/api/noauth/upload"))
            .header("content-length", BODY.to_string())
            .body(())
            .unwrap();
        let (response, mut body) = connection.send_request(request, false).unwrap();
        body.send_data(Bytes::from(vec![b'x'; SENT]), false)
            .unwrap();
        streams.push((response, body));
    }
    // The bodies that found the budget spent went on, streamed: they are
    // upstream already; the others are held, and nothing more.
    common::wait_until(
        "the bodies past the budget streamed upstream",
        Duration::from_secs(10),
        async || upstream.heads() > 0,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let streamed = upstream.heads();
    println!(
        "{STREAMS} bodies of {BODY} bytes held on one connection: {streamed} streamed upstream, \
         {} held",
        STREAMS - streamed
    );
    assert!(
        streamed >= STREAMS - (1 << 20) / SENT,
        "no more than 1 MiB of bodies held: only {streamed} streamed"
    );
    assert!(
        streamed < STREAMS / 2,
        "bodies within the budget are held: {streamed} streamed"
    );
    for (_, body) in &mut streams {
        body.send_data(Bytes::from(vec![b'y'; BODY - SENT]), true)
            .unwrap();
    }
    for (response, _) in streams {
        let response = tokio::time::timeout(Duration::from_secs(20), response)
            .await
            .expect("answered once whole")
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut text = Vec::new();
        while let Some(chunk) = body.data().await {
            text.extend_from_slice(&chunk.unwrap());
        }
        assert_eq!(String::from_utf8(text).unwrap(), format!("{BODY}\n"));
    }
    assert_eq!(
        upstream.seen().len(),
        STREAMS,
        "every request forwarded once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_small_body_reaches_the_upstream_only_once_whole() {
    let upstream = StreamingUpstream::start().await;
    let gateway = Gateway::start(&upstream.url(), "").await;
    for wire in WIRES {
        // Declared (`Content-Length`) and undeclared (HTTP/1.1 chunked,
        // HTTP/2 without a length).
        for declared in [true, false] {
            let case = format!("{wire:?}, declared: {declared}");
            let before = upstream.seen().len();
            let client = gateway.client_over(wire);
            let (feed, body) = fed_body();
            let mut request = client.post(gateway.https("/api/noauth/upload")).body(body);
            if declared {
                request = request.header("content-length", SMALL.to_string());
            }
            let sending = tokio::spawn(request.send());
            feed.send(Bytes::from(vec![b'a'; SMALL / 2])).await.unwrap();
            tokio::time::sleep(Duration::from_millis(800)).await;
            assert_eq!(
                upstream.heads(),
                before,
                "{case}: nothing forwarded while the body trickles"
            );
            feed.send(Bytes::from(vec![b'b'; SMALL / 2])).await.unwrap();
            drop(feed);
            let response = sending.await.unwrap().unwrap();
            assert_eq!(response.status(), 200, "{case}");
            assert_eq!(response.version(), wire.version(), "{case}");
            assert_eq!(
                response.text().await.unwrap(),
                format!("{SMALL}\n"),
                "{case}"
            );
            let last = upstream.seen().pop().unwrap();
            assert_eq!(last.content_length.as_deref(), Some("1000"), "{case}");
            assert!(!last.chunked, "{case}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_buffering_limit_streams_its_start_before_its_end() {
    let upstream = StreamingUpstream::start().await;
    let gateway = Gateway::start(&upstream.url(), "").await;
    const LARGE: usize = 100 * 1024;
    const BUFFERED: usize = 64 * 1024;
    for wire in WIRES {
        for declared in [true, false] {
            let case = format!("{wire:?}, declared: {declared}");
            let heads = upstream.heads();
            let bytes = upstream.body_bytes();
            let client = gateway.client_over(wire);
            let (feed, body) = fed_body();
            let mut request = client.post(gateway.https("/api/noauth/upload")).body(body);
            if declared {
                request = request.header("content-length", LARGE.to_string());
            }
            let sending = tokio::spawn(request.send());
            // More than the limit, less than the whole, then held.
            for _ in 0..10 {
                feed.send(Bytes::from(vec![b'a'; 8 * 1024])).await.unwrap();
            }
            // Over the limit, the part read goes on without waiting for the
            // rest: the upstream gets the head and at least the limit's worth
            // while the client still holds its end.
            common::wait_until(
                &format!("{case}: the start streamed upstream"),
                Duration::from_secs(10),
                async || upstream.heads() > heads && upstream.body_bytes() - bytes > BUFFERED,
            )
            .await;
            assert!(!sending.is_finished(), "{case}: answered before its end");
            for _ in 10..(LARGE / (8 * 1024)) {
                feed.send(Bytes::from(vec![b'b'; 8 * 1024])).await.unwrap();
            }
            feed.send(Bytes::from(vec![b'c'; LARGE % (8 * 1024)]))
                .await
                .unwrap();
            drop(feed);
            let response = sending.await.unwrap().unwrap();
            assert_eq!(response.status(), 200, "{case}");
            assert_eq!(
                response.text().await.unwrap(),
                format!("{LARGE}\n"),
                "{case}"
            );
            let last = upstream.seen().pop().unwrap();
            assert_eq!(last.body_len, LARGE, "{case}");
            if declared {
                assert_eq!(last.content_length.as_deref(), Some("102400"), "{case}");
            } else {
                assert!(last.chunked, "{case}: streamed, its length unknown");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_body_slower_than_the_pace_rules_is_cut_with_408_before_reaching_the_upstream() {
    let upstream = StreamingUpstream::start().await;
    let gateway = Gateway::start(&upstream.url(), "[limits]\nbody_read_timeout = \"1s\"\n").await;
    let mut cut = 0.0;
    for wire in WIRES {
        let client = gateway.client_over(wire);
        let (feed, body) = fed_body();
        let request = client
            .post(gateway.https("/api/noauth/upload"))
            .header("content-length", SMALL.to_string())
            .body(body);
        let sending = tokio::spawn(request.send());
        feed.send(Bytes::from_static(b"{")).await.unwrap();
        // Then nothing more: the wait for the next bytes passes the bound.
        let response = tokio::time::timeout(Duration::from_secs(8), sending)
            .await
            .expect("cut within the pace bound")
            .unwrap()
            .unwrap();
        let (status, json) = common::error_body(response).await;
        assert_eq!(status, 408, "{wire:?}");
        assert_eq!(json["errorCode"], 31, "{wire:?}: {json}");
        drop(feed);
        cut += 1.0;
        let metrics = gateway.metrics().await;
        assert_eq!(
            metric(
                &metrics,
                r#"keygate_client_aborts_total{kind="body_too_slow",route="noauth"}"#
            ),
            cut,
            "{wire:?}: counted as the client's doing"
        );
    }
    assert_eq!(
        upstream.peak(),
        0,
        "a slow small body never reached the upstream"
    );
    assert_eq!(upstream.heads(), 0);
}
