//! Metrics (Prometheus text format on the admin listener) and the access log.
//!
//! Labels are bounded: route names from the config, method classes, status
//! classes, fixed outcome words. Never a raw path, a user id or a credential.
//!
//! Every series of a known, bounded label set exists from the start with 0,
//! so `rate()`, `increase()` and alerts see the first event: the fixed outcome
//! words here, and the configured listeners, upstreams, caches and prune kinds
//! as their owners start ([`Metrics::init_connections`] and its siblings).
//! Requests (route × method × status class) and latency histograms are not
//! pre-created: that product is large and a histogram without observations
//! says nothing.

pub(crate) mod access;
mod limits;
#[cfg(target_os = "linux")]
mod process;
mod series;

pub use access::duration_ms;
pub use limits::LimitMetrics;
pub use series::{AUTH_METHODS, AuthSeries, CacheSeries, ClientAbort, RouteSeries, UpstreamSeries};
pub(crate) use series::{method_class, status_class};

use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Why the platform import or its sync holds a row back: the `reason`
/// label of `keygate_platform_sync_skipped_total`, and the code in the
/// import report (`import::plan::code`).
pub mod skip_reason {
    /// Not a user keygate can hold (no id, authority, tenant, credentials).
    pub const INVALID_ROW: &str = "invalid_row";
    /// The e-mail address fails the rule of the REST user endpoint.
    pub const INVALID_EMAIL: &str = "invalid_email";
    /// A field longer than the platform's own column allows.
    pub const TOO_LONG: &str = "too_long";
    /// A bcrypt hash of a cost above `login.max_bcrypt_cost`.
    pub const BCRYPT_COST: &str = "bcrypt_cost";
    /// Two or more platform rows fold to one e-mail address.
    pub const EMAIL_COLLISION: &str = "email_collision";
    /// The address is another keygate user's.
    pub const EMAIL_TAKEN: &str = "email_taken";
    /// A customer user whose customer is not in its tenant.
    pub const FOREIGN_CUSTOMER: &str = "foreign_customer";
    /// Anything else (a store refusal, a row deleted in keygate, a key).
    pub const OTHER: &str = "other";
    pub const ALL: [&str; 8] = [
        INVALID_ROW,
        INVALID_EMAIL,
        TOO_LONG,
        BCRYPT_COST,
        EMAIL_COLLISION,
        EMAIL_TAKEN,
        FOREIGN_CUSTOMER,
        OTHER,
    ];
}

pub struct Metrics {
    registry: Registry,
    traffic: Traffic,
    operations: Operations,
    pub tls_cert_not_after: IntGauge,
    /// Limits shared through Redis, and quota refusals.
    pub limits: LimitMetrics,
    /// Outgoing mail.
    pub mail: MailMetrics,
}

/// Outgoing mail: messages by kind and outcome, and the queue's depth.
pub struct MailMetrics {
    sent: IntCounterVec,
    pub queue_depth: IntGauge,
}

/// Kinds of mail ([`MailMetrics::sent`]).
pub const MAIL_KINDS: [&str; 4] = ["activation", "reset", "password_reset", "code"];
/// What became of a message, or of one attempt to send it: `sent`, `retried`
/// (an attempt failed and another follows), `dead_letter` (given up) and
/// `dropped` (the queue was full).
pub const MAIL_OUTCOMES: [&str; 4] = ["sent", "retried", "dead_letter", "dropped"];

impl MailMetrics {
    fn new(r: &Registrar<'_>) -> MailMetrics {
        let sent = r.counter(
            "keygate_mail_sent_total",
            "Outgoing mail, by kind (activation, reset, password_reset, code) and outcome (sent, retried, dead_letter, dropped).",
            &["kind", "outcome"],
        );
        let queue_depth = IntGauge::new(
            "keygate_mail_queue_depth",
            "Messages waiting in the mail queue.",
        )
        .expect("valid metric");
        r.0.register(Box::new(queue_depth.clone()))
            .expect("unique metric");
        MailMetrics { sent, queue_depth }
    }

    /// Creates every kind and outcome with 0 (mail is configured).
    pub fn init(&self) {
        for kind in MAIL_KINDS {
            for outcome in MAIL_OUTCOMES {
                self.sent.with_label_values(&[kind, outcome]);
            }
        }
    }

    pub fn sent(&self, kind: &str, outcome: &str) {
        self.sent.with_label_values(&[kind, outcome]).inc();
    }
}

/// Registers each metric as it is created; a clash is a programming error.
struct Registrar<'r>(&'r Registry);

impl Registrar<'_> {
    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.0.register(Box::new(c.clone())).expect("unique metric");
        c
    }

    fn histogram(&self, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
        let h = HistogramVec::new(
            HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
            labels,
        )
        .expect("valid metric");
        self.0.register(Box::new(h.clone())).expect("unique metric");
        h
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
        self.0.register(Box::new(g.clone())).expect("unique metric");
        g
    }

    /// A counter without labels.
    fn single_counter(&self, name: &str, help: &str) -> prometheus::IntCounter {
        let c = prometheus::IntCounter::new(name, help).expect("valid metric");
        self.0.register(Box::new(c.clone())).expect("unique metric");
        c
    }

    /// A gauge without labels.
    fn single_gauge(&self, name: &str, help: &str) -> IntGauge {
        let g = IntGauge::new(name, help).expect("valid metric");
        self.0.register(Box::new(g.clone())).expect("unique metric");
        g
    }
}

/// The request path's metrics: requests, authentication, upstreams, caches,
/// connections.
struct Traffic {
    http: HttpSeries,
    credentials: CredentialSeries,
    upstreams: UpstreamMetrics,
    connections: ConnectionSeries,
}

impl Traffic {
    fn new(r: &Registrar<'_>) -> Traffic {
        Traffic {
            http: HttpSeries::new(r),
            credentials: CredentialSeries::new(r),
            upstreams: UpstreamMetrics::new(r),
            connections: ConnectionSeries::new(r),
        }
    }
}

/// Requests answered, and those that ended early or went another way.
struct HttpSeries {
    requests: IntCounterVec,
    request_duration: HistogramVec,
    client_aborts: IntCounterVec,
    in_flight_refused: IntCounterVec,
    fast_path_declined: IntCounterVec,
}

impl HttpSeries {
    fn new(r: &Registrar<'_>) -> HttpSeries {
        let http = HttpSeries {
            requests: r.counter(
                "keygate_requests_total",
                "Requests answered, by route, method class and status class.",
                &["route", "method", "status"],
            ),
            request_duration: r.histogram(
                "keygate_request_duration_seconds",
                "Time from request head to response head, by route.",
                &["route"],
            ),
            client_aborts: r.counter(
                "keygate_client_aborts_total",
                "Proxied requests the client ended before they were done, by route and kind \
                 (body_broken: its body broke off or was malformed; body_too_slow: its body did \
                 not keep the required pace; gone: it went away before the response).",
                &["route", "kind"],
            ),
            in_flight_refused: r.counter(
                "keygate_in_flight_refused_total",
                "Proxied requests refused (429) for the in-flight bound they would pass, by bound \
                 (connection, address).",
                &["bound"],
            ),
            fast_path_declined: r.counter(
                "keygate_fast_path_declined_total",
                "HTTP/1.1 requests the lean path left to hyper's, by reason (proxy.fast_path).",
                &["reason"],
            ),
        };
        for bound in ["connection", "address"] {
            http.in_flight_refused.with_label_values(&[bound]);
        }
        for reason in crate::vocab::decline::Decline::ALL {
            http.fast_path_declined.with_label_values(&[reason.label()]);
        }
        http
    }
}

/// Authentication outcomes, the credential caches and the lookups that
/// reached the store.
struct CredentialSeries {
    auth: IntCounterVec,
    cache: IntCounterVec,
    cache_evictions: IntCounterVec,
    cache_entries: IntGaugeVec,
    store_lookups: IntCounterVec,
}

impl CredentialSeries {
    fn new(r: &Registrar<'_>) -> CredentialSeries {
        CredentialSeries {
            auth: r.counter(
                "keygate_auth_total",
                "Authentication outcomes, by credential method and result.",
                &["method", "result"],
            ),
            cache: r.counter(
                "keygate_cache_requests_total",
                "Credential cache lookups, by cache and result (hit, miss).",
                &["cache", "result"],
            ),
            cache_evictions: r.counter(
                "keygate_cache_evictions_total",
                "Credential cache entries pushed out by the size bound, by cache.",
                &["cache"],
            ),
            cache_entries: r.gauge(
                "keygate_cache_entries",
                "Entries held by each credential cache.",
                &["cache"],
            ),
            store_lookups: r.counter(
                "keygate_auth_store_lookups_total",
                "Credential lookups that reached the store (cache misses), by kind (api_key, user, session).",
                &["kind"],
            ),
        }
    }
}

/// Upstreams: their answer times and failures, and the identities carried
/// to them.
struct UpstreamMetrics {
    upstream_duration: HistogramVec,
    upstream_errors: IntCounterVec,
    tls_failures: IntCounterVec,
    passports: IntCounterVec,
}

impl UpstreamMetrics {
    fn new(r: &Registrar<'_>) -> UpstreamMetrics {
        UpstreamMetrics {
            upstream_duration: r.histogram(
                "keygate_upstream_duration_seconds",
                "Time for an upstream to answer with a response head, by upstream.",
                &["upstream"],
            ),
            upstream_errors: r.counter(
                "keygate_upstream_errors_total",
                "Upstream requests that failed, by upstream and kind (connect, timeout, reset, saturated).",
                &["upstream", "kind"],
            ),
            tls_failures: r.counter(
                "keygate_upstream_tls_handshake_failures_total",
                "TLS handshakes with https:// upstreams that failed, by route.",
                &["route"],
            ),
            passports: r.counter(
                "keygate_upstream_identity_total",
                "Assertions and platform tokens carried to upstreams, by route, identity mode \
                 and outcome (issued: signed for this request; reused: one signed earlier for \
                 the same credential and route).",
                &["route", "mode", "outcome"],
            ),
        }
    }
}

/// Client connections: open, and closed for a limit.
struct ConnectionSeries {
    open_connections: IntGaugeVec,
    connections_closed: IntCounterVec,
}

impl ConnectionSeries {
    fn new(r: &Registrar<'_>) -> ConnectionSeries {
        ConnectionSeries {
            open_connections: r.gauge(
                "keygate_open_connections",
                "Client connections currently open, by listener.",
                &["listener"],
            ),
            connections_closed: r.counter(
                "keygate_connections_closed_total",
                "Client connections keygate closed for a limit, by listener and reason \
                 (per_address_cap, tls_handshake_timeout, head_timeout, idle, keep_alive_timeout, body_timeout).",
                &["listener", "reason"],
            ),
        }
    }
}

/// Accounts, reloads, revocations, store pruning and the sync with the
/// platform.
struct Operations {
    accounts: AccountSeries,
    revocations: RevocationSeries,
    reloads: ReloadSeries,
    pruning: PruneSeries,
    sync: SyncSeries,
}

impl Operations {
    fn new(r: &Registrar<'_>) -> Operations {
        Operations {
            accounts: AccountSeries::new(r),
            revocations: RevocationSeries::new(r),
            reloads: ReloadSeries::new(r),
            pruning: PruneSeries::new(r),
            sync: SyncSeries::new(r),
        }
    }
}

/// Logins, rate limits, password hashing, and credentials ended for misuse.
struct AccountSeries {
    logins: IntCounterVec,
    rate_limited: IntCounterVec,
    password_hashes: IntCounterVec,
    password_hashes_refused: IntCounterVec,
    refresh_reuse: prometheus::IntCounter,
    keys_disabled_on_plaintext: prometheus::IntCounter,
}

impl AccountSeries {
    fn new(r: &Registrar<'_>) -> AccountSeries {
        let accounts = AccountSeries {
            logins: r.counter(
                "keygate_login_attempts_total",
                "Login attempts, by outcome (success, bad_credentials, disabled, locked, rate_limited, bad_request, second_factor_required, second_factor_enforced, bad_second_factor).",
                &["outcome"],
            ),
            rate_limited: r.counter(
                "keygate_rate_limited_total",
                "Requests refused by a rate limit, by limiter (account, address, management_writes, unknown_api_keys, email_code).",
                &["limiter"],
            ),
            password_hashes: r.counter(
                "keygate_password_hashes_total",
                "Argon2id / bcrypt computations, by allowance (login, other).",
                &["purpose"],
            ),
            password_hashes_refused: r.counter(
                "keygate_password_hashes_refused_total",
                "Requests answered 503 for finding no turn to hash within login.hash_wait, by allowance (login, other).",
                &["purpose"],
            ),
            refresh_reuse: r.single_counter(
                "keygate_refresh_token_reuse_total",
                "Retired refresh tokens presented again; each ended its session.",
            ),
            keys_disabled_on_plaintext: r.single_counter(
                "keygate_api_keys_disabled_on_plaintext_total",
                "API keys disabled because they arrived over plain HTTP.",
            ),
        };
        // Every known outcome exists with 0.
        for outcome in LOGIN_OUTCOMES {
            accounts.logins.with_label_values(&[outcome]);
        }
        for limiter in RATE_LIMITERS {
            accounts.rate_limited.with_label_values(&[limiter]);
        }
        for purpose in HASH_PURPOSES {
            accounts.password_hashes.with_label_values(&[purpose]);
            accounts
                .password_hashes_refused
                .with_label_values(&[purpose]);
        }
        accounts
    }
}

/// Revocations received from the shared store, and its listener's state.
struct RevocationSeries {
    revocations: prometheus::IntCounter,
    /// Registered only where a revocation listener runs (PostgreSQL store):
    /// elsewhere a constant 0 would read as an outage.
    revocation_listener_up: IntGauge,
}

impl RevocationSeries {
    fn new(r: &Registrar<'_>) -> RevocationSeries {
        RevocationSeries {
            revocations: r.single_counter(
                "keygate_revocation_notifications_total",
                "Revocation notifications received from the shared store.",
            ),
            revocation_listener_up: IntGauge::new(
                "keygate_revocation_listener_up",
                "1 while the revocation listener is connected to PostgreSQL, else 0. \
                 Exported only on a PostgreSQL store.",
            )
            .expect("valid metric"),
        }
    }
}

/// Reloads of routes and of the TLS certificate.
struct ReloadSeries {
    reloads: IntCounterVec,
    last_reload: IntGauge,
}

impl ReloadSeries {
    fn new(r: &Registrar<'_>) -> ReloadSeries {
        let reloads = ReloadSeries {
            reloads: r.counter(
                "keygate_config_reloads_total",
                "Reloads of routes or the TLS certificate, by what and outcome (success, failure).",
                &["what", "outcome"],
            ),
            last_reload: r.single_gauge(
                "keygate_config_last_reload_success_timestamp_seconds",
                "When a reload last succeeded (Unix time; 0 before the first).",
            ),
        };
        for what in RELOADED {
            for outcome in OUTCOMES {
                reloads.reloads.with_label_values(&[what, outcome]);
            }
        }
        reloads
    }
}

/// Store pruning: rows deleted and runs; created with 0 where pruning runs
/// ([`Metrics::init_pruning`]).
struct PruneSeries {
    pruned_rows: IntCounterVec,
    prune_runs: IntCounterVec,
}

impl PruneSeries {
    fn new(r: &Registrar<'_>) -> PruneSeries {
        PruneSeries {
            pruned_rows: r.counter(
                "keygate_store_pruned_rows_total",
                "Dead rows deleted from the store, by kind (ended_sessions, expired_sessions, activation_tokens, sso_states, audit_events).",
                &["kind"],
            ),
            prune_runs: r.counter(
                "keygate_store_prune_runs_total",
                "Runs of the store pruning, by outcome (success, failure).",
                &["outcome"],
            ),
        }
    }
}

/// The sync with the platform's database.
struct SyncSeries {
    sync_last_success: IntGauge,
    sync_rows: IntCounterVec,
    sync_errors: prometheus::IntCounter,
    sync_skipped: IntCounterVec,
}

impl SyncSeries {
    fn new(r: &Registrar<'_>) -> SyncSeries {
        let sync = SyncSeries {
            sync_last_success: r.single_gauge(
                "keygate_platform_sync_last_success_timestamp_seconds",
                "When the sync with the platform's database last succeeded (Unix time; 0 before the first, and without a sync).",
            ),
            sync_rows: r.counter(
                "keygate_platform_sync_rows_applied_total",
                "Rows the sync with the platform's database changed in keygate, by kind (users_added, users_updated, users_removed, keys_added, keys_updated, keys_removed).",
                &["kind"],
            ),
            sync_errors: r.single_counter(
                "keygate_platform_sync_errors_total",
                "Syncs with the platform's database that failed (unreachable, not the platform's, or a store error).",
            ),
            sync_skipped: r.counter(
                "keygate_platform_sync_skipped_total",
                "Platform rows the sync held back, counted once when first held back, by reason (invalid_row, invalid_email, too_long, bcrypt_cost, email_collision, email_taken, foreign_customer, other).",
                &["reason"],
            ),
        };
        for kind in SYNC_KINDS {
            sync.sync_rows.with_label_values(&[kind]);
        }
        for reason in skip_reason::ALL {
            sync.sync_skipped.with_label_values(&[reason]);
        }
        sync
    }
}

/// Login outcomes ([`Metrics::login`]).
pub const LOGIN_OUTCOMES: [&str; 15] = [
    "success",
    "bad_credentials",
    "disabled",
    "locked",
    "rate_limited",
    "bad_request",
    "second_factor_required",
    "second_factor_enforced",
    "bad_second_factor",
    "public_success",
    "public_refused",
    "sso_started",
    "sso_success",
    "sso_second_factor_required",
    "sso_failed",
];

/// Login rate limiters ([`Metrics::rate_limited`]).
pub const RATE_LIMITERS: [&str; 5] = [
    "account",
    "address",
    "management_writes",
    "unknown_api_keys",
    "email_code",
];

/// Password-hashing allowances ([`Metrics::password_hash`]).
pub const HASH_PURPOSES: [&str; 2] = ["login", "other"];

/// What the sync with the platform counts ([`Metrics::sync_applied`]).
pub const SYNC_KINDS: [&str; 6] = [
    "users_added",
    "users_updated",
    "users_removed",
    "keys_added",
    "keys_updated",
    "keys_removed",
];

/// What a reload reloads ([`Metrics::reload`]).
pub const RELOADED: [&str; 2] = ["routes", "tls"];

const OUTCOMES: [&str; 2] = ["success", "failure"];

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = Registrar(&registry);
        let traffic = Traffic::new(&r);
        let operations = Operations::new(&r);
        let limits = LimitMetrics::new(&r);
        let mail = MailMetrics::new(&r);
        let tls_cert_not_after = IntGauge::new(
            "keygate_tls_certificate_expiry_timestamp_seconds",
            "When the served TLS certificate expires (Unix time).",
        )
        .expect("valid metric");
        r.0.register(Box::new(tls_cert_not_after.clone()))
            .expect("unique metric");
        let build = r.gauge(
            "keygate_build_info",
            "Build information; the value is always 1.",
            &["version"],
        );
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        #[cfg(target_os = "linux")]
        registry
            .register(Box::new(process::ProcessCollector::new()))
            .expect("unique metric");

        Metrics {
            traffic,
            operations,
            tls_cert_not_after,
            limits,
            mail,
            registry,
        }
    }

    /// Creates a listener's connection series with 0: its open connections
    /// and each reason it may close one (`reasons`).
    pub(crate) fn init_connections(&self, listener: &str, reasons: &[&str]) {
        self.traffic
            .connections
            .open_connections
            .with_label_values(&[listener]);
        for reason in reasons {
            self.traffic
                .connections
                .connections_closed
                .with_label_values(&[listener, reason]);
        }
    }

    /// Creates a credential cache's series with 0, and returns its counters.
    pub(crate) fn init_cache(&self, cache: &str) -> CacheSeries {
        self.traffic
            .credentials
            .cache_entries
            .with_label_values(&[cache]);
        CacheSeries {
            hit: self
                .traffic
                .credentials
                .cache
                .with_label_values(&[cache, "hit"]),
            miss: self
                .traffic
                .credentials
                .cache
                .with_label_values(&[cache, "miss"]),
            eviction: self
                .traffic
                .credentials
                .cache_evictions
                .with_label_values(&[cache]),
        }
    }

    /// The request series of a route label ([`RouteSeries`]).
    pub(crate) fn route_series(&self, label: &str) -> RouteSeries {
        RouteSeries {
            label: label.into(),
            requests: self.traffic.http.requests.clone(),
            durations: self.traffic.http.request_duration.clone(),
            counters: std::array::from_fn(|_| OnceLock::new()),
            duration: OnceLock::new(),
            aborts: std::array::from_fn(|_| OnceLock::new()),
            client_aborts: self.traffic.http.client_aborts.clone(),
        }
    }

    /// The count of failed TLS handshakes with `route`'s `https://`
    /// upstreams; the series exists (at 0) from here on.
    pub(crate) fn upstream_tls_failures(&self, route: &str) -> IntCounter {
        self.traffic
            .upstreams
            .tls_failures
            .with_label_values(&[route])
    }

    /// The issued and reused counters of a route's passports.
    pub(crate) fn passport_series(&self, route: &str, mode: &str) -> [IntCounter; 2] {
        ["issued", "reused"].map(|outcome| {
            self.traffic
                .upstreams
                .passports
                .with_label_values(&[route, mode, outcome])
        })
    }

    /// Counts a proxied request refused for the in-flight `bound` it would
    /// pass ("connection" or "address").
    pub(crate) fn in_flight_refused(&self, bound: &str) {
        self.traffic
            .http
            .in_flight_refused
            .with_label_values(&[bound])
            .inc();
    }

    /// Counts an HTTP/1.1 request the lean path left to hyper's.
    pub(crate) fn fast_path_declined(&self, reason: &str) {
        self.traffic
            .http
            .fast_path_declined
            .with_label_values(&[reason])
            .inc();
    }

    /// The authentication outcome counters of the request path
    /// ([`AuthSeries`]), over the given result labels.
    pub(crate) fn auth_series(&self, results: &'static [&'static str]) -> AuthSeries {
        AuthSeries {
            auth: self.traffic.credentials.auth.clone(),
            results,
            counters: (0..AUTH_METHODS.len() * results.len())
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// Creates an authentication outcome at 0, so it is exported before it
    /// first happens.
    pub(crate) fn init_auth(&self, method: &str, result: &str) {
        self.traffic
            .credentials
            .auth
            .with_label_values(&[method, result]);
    }

    /// An upstream's series; its error series exist (at 0) from here on, one
    /// per kind (`kinds`).
    pub(crate) fn upstream_series(&self, upstream: &str, kinds: &[&str]) -> UpstreamSeries {
        UpstreamSeries {
            durations: self.traffic.upstreams.upstream_duration.clone(),
            label: upstream.into(),
            duration: OnceLock::new(),
            errors: kinds
                .iter()
                .map(|kind| {
                    self.traffic
                        .upstreams
                        .upstream_errors
                        .with_label_values(&[upstream, kind])
                })
                .collect(),
        }
    }

    /// Creates the store pruning series with 0, where pruning runs: the rows
    /// of each kind (`kinds`) and the runs by outcome.
    pub(crate) fn init_pruning(&self, kinds: &[&str]) {
        for kind in kinds {
            self.operations
                .pruning
                .pruned_rows
                .with_label_values(&[kind]);
        }
        for outcome in OUTCOMES {
            self.operations
                .pruning
                .prune_runs
                .with_label_values(&[outcome]);
        }
    }

    /// Exports `keygate_revocation_listener_up`, as 0 until the listener
    /// connects. Only a replica that runs a revocation listener calls this;
    /// calling it again is harmless.
    pub(crate) fn init_revocation_listener(&self) {
        // Already registered is the only possible error, and the same metric.
        let _ = self.registry.register(Box::new(
            self.operations.revocations.revocation_listener_up.clone(),
        ));
    }

    pub fn request(
        &self,
        route: &str,
        method: &http::Method,
        status: http::StatusCode,
        elapsed: Duration,
    ) {
        self.traffic
            .http
            .requests
            .with_label_values(&[route, method_class(method), status_class(status)])
            .inc();
        self.traffic
            .http
            .request_duration
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }

    pub fn auth(&self, method: &str, result: &str) {
        self.traffic
            .credentials
            .auth
            .with_label_values(&[method, result])
            .inc();
    }

    pub fn login(&self, outcome: &str) {
        self.operations
            .accounts
            .logins
            .with_label_values(&[outcome])
            .inc();
    }

    pub fn password_hash(&self, purpose: &str) {
        self.operations
            .accounts
            .password_hashes
            .with_label_values(&[purpose])
            .inc();
    }

    pub(crate) fn password_hash_refused(&self, purpose: &str) {
        self.operations
            .accounts
            .password_hashes_refused
            .with_label_values(&[purpose])
            .inc();
    }

    pub(crate) fn rate_limited(&self, limiter: &str) {
        self.operations
            .accounts
            .rate_limited
            .with_label_values(&[limiter])
            .inc();
    }

    pub(crate) fn refresh_reuse(&self) {
        self.operations.accounts.refresh_reuse.inc();
    }

    pub(crate) fn key_disabled_on_plaintext(&self) {
        self.operations.accounts.keys_disabled_on_plaintext.inc();
    }

    pub fn reload(&self, what: &str, ok: bool) {
        self.operations
            .reloads
            .reloads
            .with_label_values(&[what, outcome(ok)])
            .inc();
        if ok {
            self.operations
                .reloads
                .last_reload
                .set(crate::clock::now_secs());
        }
    }

    pub fn pruned(&self, kind: &str, rows: u64) {
        self.operations
            .pruning
            .pruned_rows
            .with_label_values(&[kind])
            .inc_by(rows);
    }

    pub(crate) fn prune_run(&self, ok: bool) {
        self.operations
            .pruning
            .prune_runs
            .with_label_values(&[outcome(ok)])
            .inc();
    }

    /// A sync with the platform's database succeeded at `now_secs`.
    pub(crate) fn sync_succeeded(&self, now_secs: i64) {
        self.operations.sync.sync_last_success.set(now_secs);
    }

    /// Rows of `kind` ([`SYNC_KINDS`]) a sync changed.
    pub(crate) fn sync_applied(&self, kind: &str, rows: u64) {
        self.operations
            .sync
            .sync_rows
            .with_label_values(&[kind])
            .inc_by(rows);
    }

    /// A platform row the sync holds back, by [`skip_reason`].
    pub(crate) fn platform_row_skipped(&self, reason: &str) {
        self.operations
            .sync
            .sync_skipped
            .with_label_values(&[reason])
            .inc();
    }

    pub(crate) fn sync_failed(&self) {
        self.operations.sync.sync_errors.inc();
    }

    pub(crate) fn revocation_received(&self) {
        self.operations.revocations.revocations.inc();
    }

    pub(crate) fn revocation_listener(&self, up: bool) {
        self.operations
            .revocations
            .revocation_listener_up
            .set(i64::from(up));
    }

    pub(crate) fn connection_opened(&self, listener: &str) {
        self.traffic
            .connections
            .open_connections
            .with_label_values(&[listener])
            .inc();
    }

    pub(crate) fn connection_closed(&self, listener: &str) {
        self.traffic
            .connections
            .open_connections
            .with_label_values(&[listener])
            .dec();
    }

    /// Counts a connection closed by a limit; `reason` is one fixed word.
    pub(crate) fn connection_closed_by(&self, listener: &str, reason: &str) {
        self.traffic
            .connections
            .connections_closed
            .with_label_values(&[listener, reason])
            .inc();
    }

    pub(crate) fn set_cache_entries(&self, sizes: &[(&str, u64)]) {
        for (name, size) in sizes {
            self.traffic
                .credentials
                .cache_entries
                .with_label_values(&[name])
                .set(*size as i64);
        }
    }

    /// `keygate_auth_store_lookups_total`: credential lookups that reached
    /// the store, by kind; its series belong to the authenticator.
    pub(crate) fn store_lookups(&self) -> IntCounterVec {
        self.traffic.credentials.store_lookups.clone()
    }

    /// Registers a counter family whose series a stage owns (and bounds).
    pub(crate) fn register_counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> IntCounterVec {
        Registrar(&self.registry).counter(name, help, labels)
    }

    /// Registers a gauge family whose series a stage owns (and bounds).
    pub(crate) fn register_gauge(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        Registrar(&self.registry).gauge(name, help, labels)
    }

    /// The registry in Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// A keyed digest for logging what must not be logged as typed (the name of a
/// failed login, where people sometimes type their password). The key is
/// derived from the deployment's signing key, so every replica writes the same
/// digest for the same text and lines can be correlated, while the text cannot
/// be recovered or guessed offline from the log.
pub struct LogDigest(aws_lc_rs::hmac::Key);

impl LogDigest {
    pub fn new(secret: &[u8]) -> LogDigest {
        use aws_lc_rs::hmac;
        let root = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let derived = hmac::sign(&root, b"keygate log digest v1");
        LogDigest(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }

    /// 12 hex characters of HMAC-SHA256 over the text folded as an account
    /// name ([`crate::email::fold`]).
    pub fn of(&self, text: &str) -> String {
        let tag = aws_lc_rs::hmac::sign(&self.0, crate::email::fold(text).as_bytes());
        tag.as_ref()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

fn outcome(ok: bool) -> &'static str {
    OUTCOMES[usize::from(!ok)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_digests_hide_the_text_but_match_across_replicas() {
        let a = LogDigest::new(b"shared signing key");
        let b = LogDigest::new(b"shared signing key");
        let other = LogDigest::new(b"another deployment");
        let digest = a.of("Hunter2-typed-as-name");
        assert_eq!(digest.len(), 12);
        assert!(!digest.contains("unter"));
        assert_eq!(digest, b.of(" hunter2-typed-as-name "));
        assert_ne!(digest, other.of("hunter2-typed-as-name"));
    }

    #[test]
    fn known_outcomes_are_zero_before_the_first_event() {
        let m = Metrics::new();
        let text = m.render();
        for series in [
            r#"keygate_login_attempts_total{outcome="bad_credentials"} 0"#,
            r#"keygate_rate_limited_total{limiter="address"} 0"#,
            r#"keygate_password_hashes_total{purpose="other"} 0"#,
            r#"keygate_password_hashes_refused_total{purpose="login"} 0"#,
            r#"keygate_config_reloads_total{outcome="failure",what="tls"} 0"#,
            "keygate_refresh_token_reuse_total 0",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
        assert!(!text.contains("keygate_store_prune_runs_total{"));
        m.init_pruning(&["ended_sessions"]);
        m.init_connections("https", &["idle"]);
        let _upstream = m.upstream_series("http://10.0.0.1:8080", &["connect"]);
        let _users = m.init_cache("users");
        let text = m.render();
        for series in [
            r#"keygate_store_pruned_rows_total{kind="ended_sessions"} 0"#,
            r#"keygate_store_prune_runs_total{outcome="success"} 0"#,
            r#"keygate_open_connections{listener="https"} 0"#,
            r#"keygate_connections_closed_total{listener="https",reason="idle"} 0"#,
            r#"keygate_upstream_errors_total{kind="connect",upstream="http://10.0.0.1:8080"} 0"#,
            r#"keygate_cache_requests_total{cache="users",result="miss"} 0"#,
            r#"keygate_cache_evictions_total{cache="users"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
    }

    #[test]
    fn resolved_handles_count_into_the_same_series_as_label_lookups() {
        let m = Metrics::new();
        let route = m.route_series("api");
        assert!(!m.render().contains(r#"route="api""#), "nothing before use");
        route.request(
            &http::Method::GET,
            http::StatusCode::OK,
            Duration::from_millis(1),
        );
        route.request(
            &http::Method::GET,
            http::StatusCode::OK,
            Duration::from_millis(1),
        );
        m.request(
            "api",
            &http::Method::GET,
            http::StatusCode::OK,
            Duration::from_millis(1),
        );
        let auth = m.auth_series(&["accepted", "expired"]);
        auth.count(1, 1);
        auth.count(0, 0);
        let upstream = m.upstream_series("http://10.0.0.1:8080", &["connect", "timeout"]);
        upstream.error(1);
        let text = m.render();
        for series in [
            r#"keygate_requests_total{method="GET",route="api",status="2xx"} 3"#,
            r#"keygate_request_duration_seconds_count{route="api"} 3"#,
            r#"keygate_auth_total{method="jwt",result="expired"} 1"#,
            r#"keygate_auth_total{method="api-key",result="accepted"} 1"#,
            r#"keygate_upstream_errors_total{kind="connect",upstream="http://10.0.0.1:8080"} 0"#,
            r#"keygate_upstream_errors_total{kind="timeout",upstream="http://10.0.0.1:8080"} 1"#,
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
    }

    #[test]
    fn platform_sync_series_exist_at_start_for_alerts_to_read() {
        let m = Metrics::new();
        let text = m.render();
        assert!(text.contains("keygate_platform_sync_last_success_timestamp_seconds 0"));
        assert!(text.contains("keygate_platform_sync_errors_total 0"));
        for kind in SYNC_KINDS {
            let series = format!("keygate_platform_sync_rows_applied_total{{kind=\"{kind}\"}} 0");
            assert!(text.contains(&series), "{series}");
        }
        for reason in skip_reason::ALL {
            let series = format!("keygate_platform_sync_skipped_total{{reason=\"{reason}\"}} 0");
            assert!(text.contains(&series), "{series}");
        }
        assert!(!text.contains("keygate_platform_import_skipped_total"));
        m.sync_failed();
        m.sync_applied("users_added", 3);
        m.sync_succeeded(1_700_000_000);
        m.platform_row_skipped("email_collision");
        let text = m.render();
        assert!(text.contains("keygate_platform_sync_skipped_total{reason=\"email_collision\"} 1"));
        assert!(text.contains("keygate_platform_sync_errors_total 1"));
        assert!(text.contains("keygate_platform_sync_rows_applied_total{kind=\"users_added\"} 3"));
        assert!(text.contains("keygate_platform_sync_last_success_timestamp_seconds 1700000000"));
    }

    #[test]
    fn revocation_listener_up_exists_only_once_a_listener_does() {
        let m = Metrics::new();
        assert!(!m.render().contains("keygate_revocation_listener_up"));
        m.init_revocation_listener();
        m.init_revocation_listener();
        assert!(m.render().contains("keygate_revocation_listener_up 0"));
        m.revocation_listener(true);
        assert!(m.render().contains("keygate_revocation_listener_up 1"));
    }

    #[test]
    fn metrics_render_in_text_format_with_bounded_labels() {
        let m = Metrics::new();
        m.request(
            "api",
            &http::Method::from_bytes(b"BREW").unwrap(),
            http::StatusCode::IM_A_TEAPOT,
            Duration::from_millis(3),
        );
        m.auth("api-key", "plaintext_refused");
        let text = m.render();
        assert!(
            text.contains(r#"keygate_requests_total{method="OTHER",route="api",status="4xx"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"keygate_auth_total{method="api-key",result="plaintext_refused"} 1"#)
        );
        assert!(text.contains("keygate_build_info"));
    }

    #[test]
    fn access_log_durations_have_at_most_microsecond_decimals() {
        use std::time::Duration;
        for (elapsed, shown) in [
            (Duration::from_nanos(20_661), "0.021"),
            (Duration::from_nanos(20_461), "0.02"),
            (Duration::from_micros(20_661), "20.661"),
            (Duration::from_nanos(999), "0.001"),
            (Duration::from_nanos(499), "0"),
            (
                Duration::from_secs(3) + Duration::from_micros(7),
                "3000.007",
            ),
        ] {
            assert_eq!(format!("{}", duration_ms(elapsed)), shown, "{elapsed:?}");
        }
        // Every whole number of microseconds prints with at most 3 decimals.
        for micros in (0..2_000_000u64).step_by(7) {
            let text = format!("{:?}", duration_ms(Duration::from_micros(micros)));
            let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
            assert!(decimals <= 3, "{micros} µs printed as {text}");
        }
    }
}
