//! Logging to standard error: human or JSON lines, colour only at a terminal.

use keygate::config::LogFormat;

/// `default_level` applies when `RUST_LOG` is not set.
pub fn init_logging(format: LogFormat, default_level: &str) {
    use std::io::IsTerminal;
    let asked = std::env::var("RUST_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let filter = match quiet_rustls(asked.as_deref()) {
        Some(directive) => filter.add_directive(directive),
        None => filter,
    };
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    // A log line that cannot be written (stderr closed: a log collector gone)
    // is dropped. By default the subscriber reports that with `eprintln!`,
    // which panics on the same closed stderr, killing whatever task logged:
    // the log must never take the gateway down with it.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.init(),
    }
}

/// rustls warns at every connection whose client names an IP address as its
/// server name (RFC 6066 forbids it; curl, wrk and h2load send one when given
/// an address): a line per connection about the client, which the operator
/// can do nothing about. Only errors of that module are logged, unless
/// `RUST_LOG` names rustls itself.
fn quiet_rustls(asked: Option<&str>) -> Option<tracing_subscriber::filter::Directive> {
    if asked.is_some_and(|asked| asked.contains("rustls")) {
        return None;
    }
    "rustls::msgs::handshake=error".parse().ok()
}

/// Colour escape codes only for a person at a terminal: never into a file or
/// pipe, and not when `NO_COLOR` is set to a non-empty value (no-color.org).
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_handshake_warnings_are_quiet_unless_asked_for() {
        let quiet = quiet_rustls(None).expect("quieted by default");
        assert_eq!(quiet.to_string(), "rustls::msgs::handshake=error");
        assert!(quiet_rustls(Some("warn")).is_some());
        assert!(quiet_rustls(Some("warn,rustls=debug")).is_none());
    }

    #[test]
    fn colour_only_at_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None), "never into a file or pipe");
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(true, Some(OsStr::new("false"))), "any value");
        assert!(
            use_colour(true, Some(OsStr::new(""))),
            "empty counts as unset"
        );
    }
}
