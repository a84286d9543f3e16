//! `keygate serve`: start, wait for signals (SIGHUP reloads), drain.

use std::path::{Path, PathBuf};

use keygate::config::{self, Settings, Source};
use keygate::server::{self, StartOptions};

pub(super) async fn serve(
    mut settings: Settings,
    config_file: Option<PathBuf>,
    dev: bool,
) -> anyhow::Result<()> {
    let options = StartOptions {
        bootstrap_password: std::env::var("KEYGATE_BOOTSTRAP_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty()),
    };
    if dev {
        keygate::dev::start_reference(&mut settings).await?;
    }
    let shown = dev.then(|| settings.clone());
    let running = server::start(settings, options).await?;
    crate::give_back_start_up_memory();
    if let Some(settings) = shown {
        // Written once, whole; a closed stderr must not end the server (a
        // panicking eprintln! would).
        let text = keygate::dev::quick_start(&running, &settings).await?;
        let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{text}\n").as_bytes());
    }
    // In development mode the routes point at the in-process upstream: a
    // reload from the (default) configuration would point them elsewhere, so
    // SIGHUP is ignored there.
    wait_for_signals(&running, config_file.as_deref(), dev).await;
    tracing::info!("shutting down: draining open connections");
    running.shutdown();
    running.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// Runs until SIGTERM or SIGINT. SIGHUP reloads the routes and the TLS
/// certificate from the same config file and environment; an invalid config
/// changes nothing and is reported.
#[cfg(unix)]
async fn wait_for_signals(running: &server::Running, config_file: Option<&Path>, dev: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = tokio::signal::ctrl_c() => return,
            _ = hup.recv(), if !dev => {
                let source = Source { file: config_file, env: std::env::vars().collect() };
                match config::load(&source) {
                    Ok(settings) => running.reload(&settings),
                    Err(errors) => {
                        running.reload_failed();
                        tracing::error!(
                            problems = %errors.one_line(),
                            "reload refused: the configuration is invalid; nothing changed"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signals(_running: &server::Running, _config_file: Option<&Path>, _dev: bool) {
    let _ = tokio::signal::ctrl_c().await;
}
