//! The series the request path counts on, each resolved once and then kept,
//! so counting costs no label lookup: per route, per upstream, per cache and
//! the authentication outcomes.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

/// The request series of one route label, each looked up on its first use and
/// then kept, so counting a request costs no label lookup. Nothing is created
/// before the first request, as with looking the labels up each time.
pub struct RouteSeries {
    pub(super) label: Box<str>,
    pub(super) requests: IntCounterVec,
    pub(super) durations: HistogramVec,
    pub(super) counters: [OnceLock<IntCounter>; METHOD_CLASSES * STATUS_CLASSES],
    pub(super) duration: OnceLock<Histogram>,
    pub(super) aborts: [OnceLock<IntCounter>; ClientAbort::ALL.len()],
    pub(super) client_aborts: IntCounterVec,
}

/// How a client ended a proxied request before it was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAbort {
    /// Its request body broke off or was malformed.
    BodyBroken,
    /// Its request body did not keep the required pace.
    BodyTooSlow,
    /// It went away before the response.
    Gone,
}

impl ClientAbort {
    pub const ALL: [ClientAbort; 3] = [
        ClientAbort::BodyBroken,
        ClientAbort::BodyTooSlow,
        ClientAbort::Gone,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ClientAbort::BodyBroken => "body_broken",
            ClientAbort::BodyTooSlow => "body_too_slow",
            ClientAbort::Gone => "gone",
        }
    }
}

pub(super) const METHOD_CLASSES: usize = 8;
pub(super) const STATUS_CLASSES: usize = 5;

impl RouteSeries {
    /// The route label, as the metrics and the access log name it.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Counts one answered request and its duration.
    pub fn request(&self, method: &http::Method, status: http::StatusCode, elapsed: Duration) {
        let (m, s) = (method_index(method), status_index(status));
        self.counters[m * STATUS_CLASSES + s]
            .get_or_init(|| {
                self.requests
                    .with_label_values(&[&self.label, METHOD_LABELS[m], STATUS_LABELS[s]])
            })
            .inc();
        self.duration
            .get_or_init(|| self.durations.with_label_values(&[&self.label]))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a proxied request its client ended.
    pub(crate) fn client_abort(&self, kind: ClientAbort) {
        self.aborts[kind as usize]
            .get_or_init(|| {
                self.client_aborts
                    .with_label_values(&[&self.label, kind.label()])
            })
            .inc();
    }
}

/// Authentication outcomes by credential method, each looked up on first use.
/// The outcomes are the caller's: telemetry knows only their labels.
pub struct AuthSeries {
    pub(super) auth: IntCounterVec,
    /// Result labels, in the order of the indices [`AuthSeries::count`] takes.
    pub(super) results: &'static [&'static str],
    /// `AUTH_METHODS.len() * results.len()` handles, method-major.
    pub(super) counters: Box<[OnceLock<IntCounter>]>,
}

/// The credential methods of `keygate_auth_total` the request path counts.
pub const AUTH_METHODS: [&str; 3] = ["api-key", "jwt", "none"];

impl AuthSeries {
    /// Counts one outcome: `method` indexes [`AUTH_METHODS`], `result` the
    /// result labels this series was made with.
    pub fn count(&self, method: usize, result: usize) {
        self.counters[method * self.results.len() + result]
            .get_or_init(|| {
                self.auth
                    .with_label_values(&[AUTH_METHODS[method], self.results[result]])
            })
            .inc();
    }
}

/// One upstream's series: its answer times (created on the first answer) and
/// its errors by kind (created at 0 with the upstream).
pub struct UpstreamSeries {
    pub(super) durations: HistogramVec,
    pub(super) label: Box<str>,
    pub(super) duration: OnceLock<Histogram>,
    pub(super) errors: Vec<IntCounter>,
}

impl UpstreamSeries {
    pub fn answered(&self, elapsed: Duration) {
        self.duration
            .get_or_init(|| self.durations.with_label_values(&[&self.label]))
            .observe(elapsed.as_secs_f64());
    }

    /// Counts an error of the kind at `kind` in the kinds the series was made with.
    pub fn error(&self, kind: usize) {
        self.errors[kind].inc();
    }
}

/// One credential cache's lookup and eviction counters, created at 0.
#[derive(Clone)]
pub struct CacheSeries {
    pub(super) hit: IntCounter,
    pub(super) miss: IntCounter,
    pub(super) eviction: IntCounter,
}

impl CacheSeries {
    pub fn hit(&self) {
        self.hit.inc();
    }

    pub fn miss(&self) {
        self.miss.inc();
    }

    pub(crate) fn evictions(&self, count: u64) {
        self.eviction.inc_by(count);
    }
}

const METHOD_LABELS: [&str; METHOD_CLASSES] = [
    "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "OTHER",
];
const STATUS_LABELS: [&str; STATUS_CLASSES] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

fn method_index(method: &http::Method) -> usize {
    match *method {
        http::Method::GET => 0,
        http::Method::POST => 1,
        http::Method::PUT => 2,
        http::Method::DELETE => 3,
        http::Method::PATCH => 4,
        http::Method::HEAD => 5,
        http::Method::OPTIONS => 6,
        _ => 7,
    }
}

fn status_index(status: http::StatusCode) -> usize {
    match status.as_u16() {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

pub(crate) fn method_class(method: &http::Method) -> &'static str {
    METHOD_LABELS[method_index(method)]
}

pub(crate) fn status_class(status: http::StatusCode) -> &'static str {
    STATUS_LABELS[status_index(status)]
}
