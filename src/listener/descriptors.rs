//! File descriptors: the process's limit raised as far as it may go, and
//! split so that proxying can never take the last ones.
//!
//! Every proxied request holds two descriptors (the client's connection and
//! an upstream one). Without a plan, a flood of held requests opens upstream
//! connections until `accept` fails with "Too many open files", and with it
//! the admin listener (probes, metrics) and the store. So at start:
//!
//! - the soft `RLIMIT_NOFILE` is raised to the hard limit;
//! - a reserve is set aside for what is not a client or upstream connection:
//!   the admin listener's connections, the store's pool, Redis, files and
//!   the listeners themselves ([`RESERVE`] plus those budgets);
//! - client connections (`listen.max_connections`) and upstream connections
//!   (all upstreams together, `proxy.max_upstream_connections`) share the
//!   rest, upstreams by default taking what clients leave and at least a quarter;
//!   a setting that does not fit is lowered, with a warning naming it.

use crate::config::Settings;

/// Descriptors kept for files, listeners, Redis, signals and the like, on
/// top of the admin listener's and the store's budgets.
pub const RESERVE: usize = 64;

/// How the descriptors were split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// The soft limit in force (after raising it), if it could be read.
    pub limit: Option<u64>,
    pub client_connections: usize,
    pub upstream_connections: usize,
}

/// Raises the soft descriptor limit to the hard one, logging both, and fits
/// the connection budgets of `settings` under it.
pub fn fit(settings: &mut Settings) -> Split {
    let limit = raise_limit();
    let split = split(settings, limit);
    settings.listen.max_connections = split.client_connections;
    settings.proxy.max_upstream_connections = split.upstream_connections;
    split
}

/// The split of `limit` descriptors between client and upstream
/// connections, after the reserve; settings that fit are kept as they are.
fn split(settings: &Settings, limit: Option<u64>) -> Split {
    let clients = settings.listen.max_connections;
    let upstreams = settings.proxy.max_upstream_connections;
    let Some(limit) = limit else {
        return Split {
            limit,
            client_connections: clients,
            upstream_connections: upstreams,
        };
    };
    let reserve =
        RESERVE + settings.listen.admin_max_connections + settings.store_max_connections as usize;
    let available = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserve)
        .max(2);
    let (client_connections, upstream_connections) = if upstreams == 0 {
        // Upstream connections take what clients leave, and never less than
        // a quarter: clients are lowered to leave it.
        let clients = clients.min(available - available / 4).max(1);
        (clients, available.saturating_sub(clients).max(1))
    } else if clients.saturating_add(upstreams) <= available {
        (clients, upstreams)
    } else {
        // Too many: each side gets its share of what is available, in the
        // proportion configured.
        let total = (clients + upstreams) as u128;
        let client_share = ((available as u128 * clients as u128) / total) as usize;
        (
            client_share.max(1),
            available.saturating_sub(client_share).max(1),
        )
    };
    warn_if_lowered("listen.max_connections", clients, client_connections, limit);
    warn_if_lowered(
        "proxy.max_upstream_connections",
        upstreams,
        upstream_connections,
        limit,
    );
    Split {
        limit: Some(limit),
        client_connections,
        upstream_connections,
    }
}

/// Says that `setting` (0: not configured) was lowered to `used`.
fn warn_if_lowered(setting: &str, configured: usize, used: usize, descriptor_limit: u64) {
    if used < configured {
        tracing::warn!(
            setting,
            configured,
            used,
            descriptor_limit,
            "lowered to fit the descriptor limit"
        );
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; the soft limit in
/// force afterwards.
#[cfg(unix)]
fn raise_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let before = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (before.current, before.maximum) else {
        return None;
    };
    let target = hard.unwrap_or(soft).max(soft);
    let hard = hard.map_or_else(|| "unlimited".to_owned(), |h| h.to_string());
    if target == soft {
        tracing::info!(soft, %hard, "descriptor limit");
        return Some(soft);
    }
    let raised = Rlimit {
        current: Some(target),
        maximum: before.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(soft = target, was = soft, %hard, "descriptor limit raised");
            Some(target)
        }
        Err(error) => {
            tracing::warn!(%error, soft, %hard, "descriptor limit could not be raised");
            Some(soft)
        }
    }
}

#[cfg(not(unix))]
fn raise_limit() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(clients: usize, upstreams: usize) -> Settings {
        let mut settings = crate::config::load(&crate::config::Source {
            file: None,
            env: vec![],
        })
        .unwrap();
        settings.listen.max_connections = clients;
        settings.proxy.max_upstream_connections = upstreams;
        settings
    }

    #[test]
    fn settings_that_fit_are_kept_and_upstreams_take_what_clients_leave() {
        let s = settings(1000, 0);
        let split = split(&s, Some(20_000));
        assert_eq!(split.client_connections, 1000);
        let reserve = RESERVE + s.listen.admin_max_connections + s.store_max_connections as usize;
        assert_eq!(split.upstream_connections, 20_000 - reserve - 1000);
    }

    #[test]
    fn a_small_limit_is_shared_and_the_reserve_kept() {
        let s = settings(10_000, 0);
        let split = split(&s, Some(1024));
        let reserve = RESERVE + s.listen.admin_max_connections + s.store_max_connections as usize;
        assert!(split.client_connections + split.upstream_connections <= 1024 - reserve);
        assert!(split.upstream_connections >= (1024 - reserve) / 4);
        assert!(split.client_connections > 0);
    }

    #[test]
    fn configured_upstream_connections_that_do_not_fit_are_lowered() {
        let s = settings(500, 5000);
        let split = split(&s, Some(2048));
        let reserve = RESERVE + s.listen.admin_max_connections + s.store_max_connections as usize;
        assert!(split.client_connections + split.upstream_connections <= 2048 - reserve);
        assert!(split.upstream_connections < 5000);
    }

    #[test]
    fn an_unknown_limit_changes_nothing() {
        let s = settings(10_000, 0);
        let split = split(&s, None);
        assert_eq!(
            (split.client_connections, split.upstream_connections),
            (10_000, 0)
        );
    }
}
