//! The `keygate` command: serve, check the config, manage users and API keys.

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use cli::logging::init_logging;
use cli::{Cli, Command, LogFormatArg, run};
use keygate::config::{self, LogFormat, Source};

/// mimalloc rather than the system allocator, measured with `benches/run`
/// (BENCHMARKS.md). glibc kept the 19 MiB blocks of Argon2 hashes in its
/// per-thread arenas, so that under a stream of logins keygate's resident
/// memory grew and stayed there; mimalloc gives it back, and malloc and free
/// cost less under the API-key load. It kept the start-up hash's memory for
/// reuse until [`give_back_start_up_memory`] (BENCHMARKS.md, "Choices in the code").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

unsafe extern "C" {
    /// mimalloc's own (linked with the allocator): frees the memory it keeps
    /// for reuse and gives freed pages back to the system now.
    fn mi_collect(force: bool);
}

/// Gives back what start-up freed. mimalloc purges freed pages lazily, on a
/// later allocation, and an idle server allocates nothing: the 19 MiB of the
/// Argon2 hash made at start (the dummy hash for unknown users) stayed
/// resident (BENCHMARKS.md, "Choices in the code"). Called
/// once, after start, it costs nothing under load and leaves mimalloc's
/// behaviour under a login storm as it was.
pub(crate) fn give_back_start_up_memory() {
    // SAFETY: a plain call into the allocator, which is mimalloc here.
    unsafe { mi_collect(true) }
}

mod cli;

pub(crate) const DEFAULT_CONFIG: &str = "config/keygate.toml";
/// sysexits.h EX_USAGE / EX_CONFIG-style status for a bad configuration.
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let explicit = cli.config.as_path() != Path::new(DEFAULT_CONFIG);
    let file = if explicit || cli.config.exists() {
        Some(cli.config.as_path())
    } else {
        None
    };
    let source = Source {
        file,
        env: std::env::vars().collect(),
    };
    let settings = match config::load(&source) {
        Ok(settings) => settings,
        Err(errors) => {
            eprint!("keygate: {errors}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Human) => LogFormat::Human,
        None => settings.log.format,
    };
    init_logging(format);
    if file.is_none() {
        tracing::info!("{DEFAULT_CONFIG} not found; running on built-in defaults");
    }
    if let Command::CheckConfig = cli.command {
        println!(
            "configuration is valid ({})",
            config::Count(settings.routes.len(), "route", "routes")
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("keygate: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if matches!(cli.command, Command::Serve { dev: true }) && explicit {
        eprintln!(
            "keygate: serve --dev runs on the embedded defaults with the reference upstream; \
             drop --config (or KEYGATE_CONFIG) to use it, or drop --dev to serve that configuration"
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let config_file = file.map(Path::to_path_buf);
    match runtime.block_on(run(cli.command, settings, config_file)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keygate: {e:#}");
            ExitCode::FAILURE
        }
    }
}
