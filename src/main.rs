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

/// Turns transparent huge pages off for this process. mimalloc asks for them
/// (`madvise(MADV_HUGEPAGE)`) on the arena it commits at start, so the first
/// bytes touched in each 2 MiB made all of it resident: 6-8 MiB of an idle
/// server's 33-35 MiB (`AnonHugePages` in `/proc/<pid>/smaps_rollup`;
/// 25-27 MiB without, BENCHMARKS.md, "Choices in the code"). Under load the
/// CPU per request did not change measurably (`benches/run`). Done before
/// anything of size is allocated; a kernel that refuses leaves it as it was.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    let cli = Cli::parse();
    if let Command::ReferenceUpstream(args) = cli.command {
        return reference_upstream(args);
    }
    let explicit = cli.config.as_path() != Path::new(DEFAULT_CONFIG);
    let file = if explicit || cli.config.exists() {
        Some(cli.config.as_path())
    } else {
        None
    };
    let origin = file.map_or_else(
        || format!("built-in defaults ({DEFAULT_CONFIG} not found)"),
        |f| f.display().to_string(),
    );
    let _ = cli::CONFIG_ORIGIN.set(origin.clone());
    let asked_json = matches!(cli.log_format, Some(LogFormatArg::Json));
    let mut settings = match load_settings(file, asked_json) {
        Ok(settings) => settings,
        Err(code) => return code,
    };
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Human) => LogFormat::Human,
        None => settings.log.format,
    };
    settings.log.format = format;
    // A management command's own output is what it prints; its log is for
    // what went wrong (the audit line of its change is in `keygate audit`).
    let serving = matches!(cli.command, Command::Serve { .. });
    init_logging(format, if serving { "info" } else { "warn" });
    if !cli.quiet {
        log_origin(&origin, &settings, serving, format);
    }
    if let Command::CheckConfig { connect } = cli.command {
        return check_config(&settings, connect, format);
    }
    run_command(cli.command, settings, file, explicit, format)
}

/// The settings from `file` (if any) and the environment; a configuration
/// that does not load is reported (as a JSON log line when asked for) and
/// ends the command with [`EXIT_CONFIG`].
fn load_settings(file: Option<&Path>, asked_json: bool) -> Result<config::Settings, ExitCode> {
    let source = Source {
        file,
        env: std::env::vars().collect(),
    };
    config::load(&source).map_err(|errors| {
        if asked_json {
            init_logging(LogFormat::Json, "error");
            tracing::error!(problems = %errors.one_line(), "invalid configuration");
        } else {
            eprint!("keygate: {errors}");
        }
        ExitCode::from(EXIT_CONFIG)
    })
}

/// Says which configuration and store a command runs with: logged when
/// serving, else on standard error (a JSON line in the JSON format).
fn log_origin(origin: &str, settings: &config::Settings, serving: bool, format: LogFormat) {
    let store = config::redacted_url(&settings.store_url);
    if serving {
        tracing::info!(config = %origin, store = %store, "configuration and store");
    } else if format == LogFormat::Json {
        let line = serde_json::json!({
            "level": "INFO",
            "fields": {"message": "configuration and store", "config": origin, "store": store},
            "target": "keygate",
        });
        eprintln!("{line}");
    } else {
        eprintln!("keygate: config {origin}; store {store}");
    }
}

/// Reports a command's failure in the log format, and ends it with `code`.
fn fail(format: LogFormat, message: String, code: ExitCode) -> ExitCode {
    match format {
        LogFormat::Json => tracing::error!("{message}"),
        LogFormat::Human => eprintln!("keygate: {message}"),
    }
    code
}

/// Runs `command` on a runtime of its own, with the loaded settings.
fn run_command(
    command: Command,
    settings: config::Settings,
    file: Option<&Path>,
    explicit: bool,
    format: LogFormat,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return fail(
                format,
                format!("starting the runtime: {e}"),
                ExitCode::FAILURE,
            );
        }
    };
    if matches!(command, Command::Serve { dev: true }) && explicit {
        return fail(
            format,
            "serve --dev runs on the embedded defaults with the reference upstream; \
             drop --config (or KEYGATE_CONFIG) to use it, or drop --dev to serve that configuration"
                .into(),
            ExitCode::from(EXIT_CONFIG),
        );
    }
    let config_file = file.map(Path::to_path_buf);
    let result = runtime.block_on(run(command, settings, config_file));
    // Nothing left to wait for: background tasks (the pool's reaper, a
    // watcher) are not waited on at exit.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format, cli::one_line(&e), ExitCode::FAILURE),
    }
}

/// `keygate reference-upstream`: the reference entity service on its own. It
/// has nothing to do with keygate's configuration or store, so it reads and
/// names neither.
fn reference_upstream(args: keygate::dev::ReferenceUpstreamArgs) -> ExitCode {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .and_then(|runtime| {
            let result = runtime.block_on(keygate::dev::run_reference_upstream(
                args,
                keygate::dev::terminated(),
            ));
            runtime.shutdown_background();
            result
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("keygate: reference-upstream: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `keygate check-config`: the file and environment were valid when this
/// runs; the certificate files are read and, with `--connect`, the store and
/// Redis are reached. Every problem found is printed.
fn check_config(settings: &config::Settings, connect: bool, format: LogFormat) -> ExitCode {
    let mut problems = Vec::new();
    let mut reached = Vec::new();
    if let Some((cert, key)) = &settings.tls_files {
        problems.extend(keygate::tls::check_files(cert, key));
    }
    if connect {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => {
                let found = runtime.block_on(cli::reach_dependencies(settings));
                problems.extend(found.problems);
                reached = found.reached;
                runtime.shutdown_background();
            }
            Err(e) => problems.push(format!("starting the runtime: {e}")),
        }
    }
    if problems.is_empty() {
        let mut summary = config::Count(settings.routes.len(), "route", "routes").to_string();
        for what in &reached {
            summary.push_str("; ");
            summary.push_str(what);
        }
        println!("configuration is valid ({summary})");
        return ExitCode::SUCCESS;
    }
    let errors = config::ConfigErrors(problems);
    match format {
        LogFormat::Json => tracing::error!(problems = %errors.one_line(), "invalid configuration"),
        LogFormat::Human => eprint!("keygate: {errors}"),
    }
    ExitCode::from(EXIT_CONFIG)
}
