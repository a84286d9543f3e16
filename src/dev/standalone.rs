//! The reference entity service run on its own, as a process of its own:
//! `keygate reference-upstream` (and the `entity_service` example, a thin
//! wrapper around the same arguments). The walk-through runs it beside
//! `keygate serve`, the production shape on one machine.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use tokio::net::TcpListener;

use super::AssertionCheck;

/// The arguments of the reference upstream run on its own.
#[derive(clap::Args, Debug, Clone)]
pub struct ReferenceUpstreamArgs {
    /// Address to listen on (port 0 picks a free port). Only keygate may
    /// reach it: it trusts the `X-Auth-*` headers it is sent.
    #[arg(long, env = "ENTITY_SERVICE_LISTEN", default_value = "127.0.0.1:9000")]
    pub listen: String,
    /// keygate's JWKS (plain HTTP): verify the identity assertion of every
    /// `/api/` request against it. Unset: trust the `X-Auth-*` headers.
    #[arg(long, env = "ENTITY_SERVICE_JWKS_URL")]
    pub jwks_url: Option<http::Uri>,
    /// The `iss` assertions must carry (keygate's `assertion.issuer`).
    #[arg(long, env = "ENTITY_SERVICE_ISSUER", default_value = "keygate")]
    pub issuer: String,
    /// The `aud` assertions must carry (the route's audience or name).
    #[arg(long, env = "ENTITY_SERVICE_AUDIENCE", default_value = "api")]
    pub audience: String,
}

/// Binds `args.listen`, prints `entity_service listening on <addr>` to
/// stdout (scripts read the port from it), and serves until `shutdown`.
pub async fn run_reference_upstream(
    args: ReferenceUpstreamArgs,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(&args.listen).await.map_err(|error| {
        std::io::Error::new(
            error.kind(),
            format!("listening on {}: {error}", args.listen),
        )
    })?;
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "entity_service listening on {}",
        listener.local_addr()?
    )?;
    stdout.flush()?;
    match args.jwks_url {
        Some(jwks_url) => {
            let check = AssertionCheck {
                jwks_url,
                issuer: args.issuer,
                audience: args.audience,
                refetch_after: Duration::from_secs(30),
            };
            super::serve_reference_upstream_verifying(listener, shutdown, check).await;
        }
        None => super::serve_reference_upstream(listener, shutdown).await,
    }
    Ok(())
}

/// Resolves at SIGTERM or Ctrl-C (SIGINT).
pub async fn terminated() {
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
