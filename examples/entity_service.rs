//! Reference upstream "entity service" for running behind the keygate gateway
//! (see `keygate::dev::serve_reference_upstream` for what it serves). The same
//! as `keygate reference-upstream`, which needs no build of its own; kept for
//! the scripts and tests that start this example.
//!
//! ```text
//! cargo run --example entity_service -- --listen 127.0.0.1:9000
//! ```
//!
//! Once bound it prints `entity_service listening on <addr>` to stdout. It
//! exits on Ctrl-C or SIGTERM.

use clap::Parser;
use keygate::dev::{ReferenceUpstreamArgs, run_reference_upstream, terminated};

#[derive(Parser)]
#[command(about = "Reference upstream entity service that trusts gateway identity headers")]
struct Args {
    #[command(flatten)]
    upstream: ReferenceUpstreamArgs,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    run_reference_upstream(args.upstream, terminated()).await?;
    eprintln!("entity_service shutting down");
    Ok(())
}
