//! Requests held open to tie up upstream connections: a client that opens
//! many HTTP/2 streams, each declaring a large body and trickling one byte,
//! must not hold more upstream connections than its in-flight bounds, nor
//! hold them for longer than the body's pace allows; an upstream has a
//! ceiling of open connections with a short queue, then 503; and a polite
//! client from another address is served promptly throughout. What is not
//! about HTTP/2's streams runs over both wires ([`common::WIRES`]).

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Gateway, WIRES, Wire};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// An upstream that counts the connections it has open (and the most it
/// ever had), reads every request body whole before answering, and answers
/// `/api/noauth/wait` after [`SLOW_ANSWER`].
/// Long enough that every request of a burst arrives, even on a loaded
/// machine, before the first slow answer frees its connection.
const SLOW_ANSWER: Duration = Duration::from_secs(4);

struct CountingUpstream {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl CountingUpstream {
    async fn start() -> CountingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (counting, highest) = (open.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let now = counting.fetch_add(1, Ordering::SeqCst) + 1;
                highest.fetch_max(now, Ordering::SeqCst);
                let counting = counting.clone();
                tokio::spawn(async move {
                    let service = service_fn(|req: Request<Incoming>| async move {
                        let slow = req.uri().path() == "/api/noauth/wait";
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        if slow {
                            tokio::time::sleep(SLOW_ANSWER).await;
                        }
                        let len = body.map_or(0, |b| b.len());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "{len}\n"
                        )))))
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    counting.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        CountingUpstream { addr, open, peak }
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
}

async fn h2c(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send.ready().await.unwrap()
}

/// A request from a loopback address other than the attacker's.
async fn polite_request(gateway: &Gateway, path: &str) -> (u16, Duration) {
    let client = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let started = Instant::now();
    let response = client.get(gateway.http(path)).send().await.unwrap();
    (response.status().as_u16(), started.elapsed())
}

/// Opens `streams` POSTs on `connection`, each declaring a body of a
/// megabyte and sending one byte of it; returns the responses to come and
/// the bodies left open.
fn trickle(
    connection: &mut h2::client::SendRequest<Bytes>,
    http: SocketAddr,
    streams: usize,
) -> Vec<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> {
    let mut held = Vec::new();
    for _ in 0..streams {
        let request = Request::post(format!("http://{http}/api/noauth/upload"))
            .header("content-length", "1000000")
            .body(())
            .unwrap();
        let Ok((response, mut body)) = connection.send_request(request, false) else {
            break;
        };
        // A stream keygate refused at once (429) may be closed before its
        // byte goes: the refusal is read from its response.
        let _ = body.send_data(Bytes::from_static(b"x"), false);
        held.push((response, body));
    }
    held
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// HTTP/2 only: many streams on one connection are what it is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_http2_bodies_from_one_address_hold_no_more_upstream_connections_than_its_bound() {
    let upstream = CountingUpstream::start().await;
    let gateway = Gateway::start(
        &upstream.url(),
        "[limits]\nmax_in_flight_per_connection = 4\nmax_in_flight_per_address = 8\n\
         body_read_timeout = \"5s\"\n",
    )
    .await;
    let http = gateway.running.http.unwrap();

    // Six attacking connections of twelve streams each: 72 held bodies
    // asked for, where each once took an upstream connection of its own.
    let mut attack = Vec::new();
    for _ in 0..6 {
        let mut connection = h2c(http).await;
        attack.extend(trickle(&mut connection, http, 12));
        attack_keepalive(connection);
    }
    assert_eq!(attack.len(), 72, "every stream was opened");

    // Refusals come at once: 429 for every stream over the bounds, while
    // the admitted ones wait for their bodies (well within the pace bound).
    let (responses, bodies): (Vec<_>, Vec<_>) = attack.into_iter().unzip();
    let window = Duration::from_millis(2500);
    let outcomes = futures_util::future::join_all(
        responses
            .into_iter()
            .map(|response| tokio::time::timeout(window, response)),
    )
    .await;
    let mut refused = 0;
    let mut pending = Vec::new();
    for (outcome, body) in outcomes.into_iter().zip(bodies) {
        match outcome {
            Ok(Ok(response)) => {
                assert_eq!(response.status(), 429, "over the in-flight bound");
                refused += 1;
            }
            Ok(Err(error)) => panic!("stream failed: {error}"),
            Err(_) => pending.push(body),
        }
    }
    let held_upstream = upstream.open();
    let (status, took) = polite_request(&gateway, "/api/noauth/info").await;
    println!(
        "72 trickled streams: {refused} refused at once, {} held, {held_upstream} upstream \
         connections open (peak {}); a polite request took {took:?}",
        pending.len(),
        upstream.peak()
    );
    assert_eq!(refused, 72 - 8, "all but the address's bound refused");
    assert!(
        upstream.peak() <= 8 + 1,
        "upstream connections stay within the address bound (and the polite one): peak {}",
        upstream.peak()
    );
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(5),
        "a polite client waited {took:?}"
    );

    // The held bodies stop arriving: their upstream connections are given
    // back after the body's pace bound, not the route's 60 s timeout.
    common::wait_until(
        "held upstream connections closed",
        Duration::from_secs(20),
        async || upstream.open() <= 1,
    )
    .await;
    drop(pending);
    let metrics = gateway.metrics().await;
    assert!(
        metric(
            &metrics,
            r#"keygate_client_aborts_total{kind="body_too_slow",route="noauth"}"#
        ) >= 8.0,
        "slow bodies are counted as the client's: {metrics}"
    );
    assert_eq!(
        metric(&metrics, r#"keygate_upstream_errors_total{kind="reset""#),
        0.0,
        "no client's doing counted against the upstream"
    );
    // Which bound refuses a stream first depends on how the connections'
    // streams interleave; together they refused every one over the bounds.
    let refused_by_bounds = metric(
        &metrics,
        r#"keygate_in_flight_refused_total{bound="address"}"#,
    ) + metric(
        &metrics,
        r#"keygate_in_flight_refused_total{bound="connection"}"#,
    );
    assert_eq!(refused_by_bounds, 64.0, "{metrics}");
}

/// Keeps an attacking connection's handle alive for the test's length.
fn attack_keepalive(connection: h2::client::SendRequest<Bytes>) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(connection);
    });
}

/// Over each wire, on a gateway and upstream of its own (the ceiling counts
/// the upstream's connections, which the first wire's would still hold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_at_its_connection_ceiling_queues_briefly_then_answers_503() {
    for wire in WIRES {
        at_the_ceiling(wire).await;
    }
}

async fn at_the_ceiling(wire: Wire) {
    let upstream = CountingUpstream::start().await;
    let gateway = Gateway::start(
        &upstream.url(),
        "[proxy]\nmax_connections_per_upstream = 3\nupstream_queue = 2\n\
         upstream_queue_timeout = \"200ms\"\n",
    )
    .await;
    let declines = gateway.declines().await;
    let client = gateway.client_over(wire);
    let asks = (0..8).map(|_| {
        let client = client.clone();
        let url = gateway.https("/api/noauth/wait");
        tokio::spawn(async move { client.get(url).send().await.unwrap() })
    });
    let mut answered = 0;
    let mut busy = 0;
    for ask in futures_util::future::join_all(asks).await {
        let response = ask.unwrap();
        assert_eq!(response.version(), wire.version());
        match response.status().as_u16() {
            200 => answered += 1,
            503 => {
                assert_eq!(response.headers()["retry-after"], "1");
                let (_, json) = common::error_body(response).await;
                assert_eq!(json["message"], "Upstream service is busy");
                busy += 1;
            }
            other => panic!("{wire:?}: unexpected status {other}"),
        }
    }
    println!(
        "{wire:?}: 8 slow requests, ceiling 3: {answered} answered, {busy} refused, upstream peak {}",
        upstream.peak()
    );
    assert_eq!(
        upstream.peak(),
        3,
        "{wire:?}: never more than the ceiling open"
    );
    assert_eq!(answered, 3, "{wire:?}: the ceiling's worth are served");
    assert_eq!(busy, 5, "{wire:?}: the rest wait briefly, then 503");
    let metrics = gateway.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            r#"keygate_upstream_errors_total{kind="saturated""#
        ),
        5.0,
        "{wire:?}"
    );
    gateway
        .assert_lean_path_took(&declines, &[], &format!("{wire:?}"))
        .await;
}

/// Opens `streams` HTTP/1.1 connections, each sending a POST head that
/// declares a body of a megabyte and one byte of it; returns them open.
async fn trickle_http1(http: SocketAddr, streams: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::new();
    for _ in 0..streams {
        let mut tcp = tokio::net::TcpStream::connect(http).await.unwrap();
        tcp.write_all(
            b"POST /api/noauth/upload HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000000\r\n\r\nx",
        )
        .await
        .unwrap();
        held.push(tcp);
    }
    held
}

/// Over HTTP/1.1 a body that has not arrived with its head is hyper's
/// path's to pace (the lean path declines it as `body_pending`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_mid_body_are_counted_as_aborts_not_upstream_resets() {
    let upstream = CountingUpstream::start().await;
    let gateway = Gateway::start(&upstream.url(), "").await;
    let http = gateway.running.http.unwrap();
    let mut before = 0.0;
    for wire in WIRES {
        let declines = gateway.declines().await;
        hang_up_mid_body(&upstream, http, wire).await;
        let pending = gateway.declines().await.since(&declines);
        let expected = if wire == Wire::Http1 { 4 } else { 0 };
        assert_eq!(pending.of_reason("body_pending"), expected, "{wire:?}");
        let metrics = gateway.metrics().await;
        let aborts: f64 = ["body_broken", "gone"]
            .iter()
            .map(|kind| {
                metric(
                    &metrics,
                    &format!(r#"keygate_client_aborts_total{{kind="{kind}",route="noauth"}}"#),
                )
            })
            .sum();
        assert!(
            aborts - before >= 4.0,
            "{wire:?}: each hang-up counted as the client's: {metrics}"
        );
        before = aborts;
        assert_eq!(
            metric(&metrics, r#"keygate_upstream_errors_total{kind="reset""#),
            0.0,
            "{wire:?}: no hang-up counted against the upstream"
        );
    }
}

/// Four requests over `wire` each start a large body, reach the upstream,
/// and then the client drops its connection(s); waits until the upstream's
/// connections are given back.
async fn hang_up_mid_body(upstream: &CountingUpstream, http: SocketAddr, wire: Wire) {
    let held: Box<dyn std::any::Any + Send> = match wire {
        Wire::Http1 => Box::new(trickle_http1(http, 4).await),
        Wire::Http2 => {
            let mut connection = h2c(http).await;
            let held = trickle(&mut connection, http, 4);
            assert_eq!(held.len(), 4, "every stream was opened");
            Box::new((held, connection))
        }
    };
    common::wait_until(
        "bodies under way upstream",
        Duration::from_secs(20),
        async || upstream.open() >= 4,
    )
    .await;
    drop(held);
    common::wait_until(
        "upstream connections given back",
        Duration::from_secs(20),
        async || upstream.open() == 0,
    )
    .await;
}
