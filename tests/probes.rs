//! The admin listener's probes cannot be starved: silent connections give
//! their place back quickly, one address cannot take the admin budget, and
//! a client at its connection cap on the HTTPS listener does not share that
//! cap with the probes.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::{Gateway, Upstream};
use tokio::net::{TcpSocket, TcpStream};

/// Opens a connection from `from` to `to` and sends nothing on it.
async fn silent(from: IpAddr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// `/healthz` from `from`, timed; `None` when refused or not answered in 10 s.
async fn probe(from: IpAddr, admin: SocketAddr) -> (Option<u16>, Duration) {
    let client = reqwest::Client::builder()
        .local_address(from)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = Instant::now();
    let status = client
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    (status, started.elapsed())
}

const ATTACKER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
const PROBER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_silent_admin_connections_from_one_address_do_not_delay_a_probe() {
    let (_upstream, gateway) = common::gateway("").await;
    let admin = gateway.running.admin.unwrap();
    let mut held = Vec::new();
    for _ in 0..64 {
        held.push(silent(ATTACKER, admin).await);
    }
    let (status, took) = probe(PROBER, admin).await;
    println!("probe with 64 silent admin connections held: {status:?} in {took:?}");
    assert_eq!(status, Some(200));
    assert!(
        took < Duration::from_secs(5),
        "the probe waited {took:?} behind silent connections"
    );
    // The attacker's own address holds at most its admin cap: the rest were
    // closed at once; and a silent connection is closed after the short
    // admin head deadline (2 s), not the 10 s of the client listeners.
    let started = Instant::now();
    let mut closed = 0;
    for mut stream in held {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            Duration::from_secs(8),
            tokio::io::AsyncReadExt::read(&mut stream, &mut byte),
        )
        .await;
        if matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    assert_eq!(closed, 64, "every silent admin connection was closed");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "silent admin connections held for {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_at_its_client_connection_cap_can_still_be_probed() {
    let upstream = Upstream::start().await;
    let gateway = Gateway::start(
        &upstream.url(),
        "[listen]\nmax_connections_per_address = 16\n",
    )
    .await;
    let https = gateway.running.https.unwrap();
    let admin = gateway.running.admin.unwrap();
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(silent(ATTACKER, https).await);
    }
    // Over the cap, the HTTPS listener closes a new connection at once.
    let mut extra = silent(ATTACKER, https).await;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut extra, &mut byte),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the HTTPS cap holds"
    );
    let (status, took) = probe(ATTACKER, admin).await;
    assert_eq!(status, Some(200), "the same address is probed all the same");
    assert!(took < Duration::from_secs(5), "the probe took {took:?}");
    drop(held);
}
