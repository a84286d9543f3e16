//! Reference upstream "entity service" for running behind the keygate gateway
//! (see `keygate::dev::serve_reference_upstream` for what it serves).
//!
//! Run it with:
//!
//! ```text
//! cargo run --example entity_service -- --listen 127.0.0.1:9000
//! ```
//!
//! Behind an `identity = "assertion"` route, give it keygate's JWKS and the
//! route's audience: it then refuses (401) every `/api/` request without a
//! valid `X-Auth-Assertion`, and acts as the identity it asserts:
//!
//! ```text
//! cargo run --example entity_service -- --listen 127.0.0.1:9000 \
//!     --jwks-url http://127.0.0.1:8080/.well-known/jwks.json \
//!     --issuer keygate --audience api
//! ```
//!
//! Once bound it prints `entity_service listening on <addr>` to stdout. It
//! exits on Ctrl-C or SIGTERM.

use std::io::Write;

use clap::Parser;
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(about = "Reference upstream entity service that trusts gateway identity headers")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, env = "ENTITY_SERVICE_LISTEN", default_value = "127.0.0.1:9000")]
    listen: String,
    /// keygate's JWKS (plain HTTP): verify the identity assertion of every
    /// `/api/` request against it. Unset: trust the `X-Auth-*` headers.
    #[arg(long, env = "ENTITY_SERVICE_JWKS_URL")]
    jwks_url: Option<http::Uri>,
    /// The `iss` assertions must carry (keygate's `assertion.issuer`).
    #[arg(long, env = "ENTITY_SERVICE_ISSUER", default_value = "keygate")]
    issuer: String,
    /// The `aud` assertions must carry (the route's audience or name).
    #[arg(long, env = "ENTITY_SERVICE_AUDIENCE", default_value = "api")]
    audience: String,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(&args.listen).await?;
    println!("entity_service listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    match args.jwks_url {
        Some(jwks_url) => {
            let check = keygate::dev::AssertionCheck {
                jwks_url,
                issuer: args.issuer,
                audience: args.audience,
                refetch_after: std::time::Duration::from_secs(30),
            };
            keygate::dev::serve_reference_upstream_verifying(listener, shutdown_signal(), check)
                .await;
        }
        None => keygate::dev::serve_reference_upstream(listener, shutdown_signal()).await,
    }
    eprintln!("entity_service shutting down");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => drop(stream.recv().await),
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
