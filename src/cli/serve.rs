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
        ..StartOptions::default()
    };
    // Caught from before the server starts: a SIGHUP or SIGTERM in the
    // moment between "serving" and waiting for signals must not end the
    // process with the default action.
    let signals = Signals::install(config_file.as_deref());
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
    wait_for_signals(signals, &running, config_file.as_deref(), dev).await;
    tracing::info!("shutting down: draining open connections");
    running.shutdown();
    running.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// Runs until SIGTERM or SIGINT. SIGHUP reloads the routes and the TLS
/// certificate from the same config file and environment; an invalid config
/// changes nothing and is reported, and every other changed setting is named
/// in a warning: it takes effect at the next start.
#[cfg(unix)]
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    /// The settings as written at start, to name what a reload cannot apply.
    started: Option<config::Written>,
}

#[cfg(unix)]
impl Signals {
    fn install(config_file: Option<&Path>) -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
            started: config::load_written(&source(config_file))
                .ok()
                .map(|(_, w)| w),
        }
    }
}

fn source(config_file: Option<&Path>) -> Source<'_> {
    Source {
        file: config_file,
        env: std::env::vars().collect(),
    }
}

#[cfg(unix)]
async fn wait_for_signals(
    signals: Signals,
    running: &server::Running,
    config_file: Option<&Path>,
    dev: bool,
) {
    let Signals {
        term: Some(mut term),
        hup: Some(mut hup),
        started,
    } = signals
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = tokio::signal::ctrl_c() => return,
            _ = hup.recv(), if !dev => {
                match config::load_written(&source(config_file)) {
                    Ok((settings, written)) => {
                        running.reload(&settings);
                        let changed = started
                            .as_ref()
                            .map(|started| config::needs_restart(started, &written))
                            .unwrap_or_default();
                        for name in changed {
                            tracing::warn!(
                                setting = %name,
                                "{name} changed: needs a restart; a reload applies only the routes and the TLS certificate"
                            );
                        }
                    }
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
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install(_config_file: Option<&Path>) -> Signals {
        Signals
    }
}

#[cfg(not(unix))]
async fn wait_for_signals(
    _signals: Signals,
    _running: &server::Running,
    _config_file: Option<&Path>,
    _dev: bool,
) {
    let _ = tokio::signal::ctrl_c().await;
}
