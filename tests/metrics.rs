//! End to end: what an operator scrapes from the admin listener of a real
//! server, before any traffic reached it.

mod common;

/// The value of the exact series `series` (name and labels), if exported.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split(' ').next()?.parse().ok()
    })
}

#[tokio::test]
async fn process_metrics_are_exported_and_plausible() {
    let (_upstream, gw) = common::gateway("").await;
    let metrics = gw.metrics().await;
    let get = |name: &str| value(&metrics, name).unwrap_or_else(|| panic!("{name}:\n{metrics}"));
    let rss = get("process_resident_memory_bytes");
    let virtual_memory = get("process_virtual_memory_bytes");
    assert!(rss > 1024.0 * 1024.0, "rss {rss}");
    assert!(
        virtual_memory >= rss,
        "virtual {virtual_memory} < rss {rss}"
    );
    let open = get("process_open_fds");
    let max = get("process_max_fds");
    assert!(open >= 3.0 && open <= max, "open {open}, max {max}");
    assert!(get("process_threads") >= 2.0, "a multi-threaded runtime");
    assert!(get("process_cpu_seconds_total") >= 0.0);
    let started = get("process_start_time_seconds");
    let now = keygate::clock::now_secs() as f64;
    assert!(
        started <= now + 1.0 && started > now - 3600.0,
        "started {started}, now {now}: this test process started within the hour"
    );
    assert!(metrics.contains("# TYPE process_cpu_seconds_total counter"));
    assert!(metrics.contains("# TYPE process_resident_memory_bytes gauge"));
}

#[tokio::test]
async fn known_outcome_series_are_zero_before_any_traffic() {
    let (upstream, gw) = common::gateway("").await;
    let metrics = gw.metrics().await;
    let upstream_label = upstream.url();
    let mut expected: Vec<String> = [
        r#"keygate_auth_total{method="api-key",result="accepted"}"#,
        r#"keygate_auth_total{method="api-key",result="unknown"}"#,
        r#"keygate_auth_total{method="jwt",result="expired"}"#,
        r#"keygate_auth_total{method="none",result="missing"}"#,
        r#"keygate_auth_total{method="password",result="plaintext_refused"}"#,
        r#"keygate_login_attempts_total{outcome="success"}"#,
        r#"keygate_login_attempts_total{outcome="bad_credentials"}"#,
        r#"keygate_login_attempts_total{outcome="locked"}"#,
        r#"keygate_rate_limited_total{limiter="account"}"#,
        r#"keygate_rate_limited_total{limiter="address"}"#,
        r#"keygate_password_hashes_total{purpose="login"}"#,
        r#"keygate_password_hashes_total{purpose="other"}"#,
        "keygate_refresh_token_reuse_total",
        r#"keygate_config_reloads_total{outcome="failure",what="routes"}"#,
        r#"keygate_config_reloads_total{outcome="success",what="tls"}"#,
        r#"keygate_store_prune_runs_total{outcome="failure"}"#,
        r#"keygate_store_pruned_rows_total{kind="expired_sessions"}"#,
        r#"keygate_cache_requests_total{cache="api_keys",result="hit"}"#,
        r#"keygate_cache_evictions_total{cache="tokens"}"#,
    ]
    .map(String::from)
    .to_vec();
    for listener in ["https", "http", "admin"] {
        for reason in ["per_address_cap", "head_timeout", "idle", "body_timeout"] {
            expected.push(format!(
                r#"keygate_connections_closed_total{{listener="{listener}",reason="{reason}"}}"#
            ));
        }
    }
    for kind in ["connect", "timeout", "reset"] {
        expected.push(format!(
            r#"keygate_upstream_errors_total{{kind="{kind}",upstream="{upstream_label}"}}"#
        ));
    }
    for series in &expected {
        assert_eq!(value(&metrics, series), Some(0.0), "{series}:\n{metrics}");
    }
    assert!(
        !metrics.contains("keygate_requests_total{"),
        "request series start with the first request"
    );
}

#[tokio::test]
async fn revocation_listener_up_is_not_exported_on_sqlite() {
    let (_upstream, gw) = common::gateway("").await;
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains("keygate_revocation_listener_up"),
        "no listener, no gauge that reads as one being down:\n{metrics}"
    );
}

#[tokio::test]
async fn store_pruning_series_exist_only_where_pruning_runs() {
    let (_upstream, gw) = common::gateway("[retention]\ninterval = \"0s\"\n").await;
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains("keygate_store_prune_runs_total{"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("keygate_store_pruned_rows_total{"),
        "{metrics}"
    );
}
