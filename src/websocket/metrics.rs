//! The WebSocket series: open sockets by route, authentication outcomes by
//! form, closes by reason. Every label is bounded: configured routes, fixed
//! words.

use prometheus::{IntCounterVec, IntGaugeVec};

use super::ending::Ending;
use super::handshake::Form;
use crate::auth::AuthFailure;
use crate::telemetry::Metrics;

pub struct SocketMetrics {
    open: IntGaugeVec,
    auth: IntCounterVec,
    closes: IntCounterVec,
}

/// The result of an authentication that did not get as far as a credential.
pub const NO_AUTH_CMD: &str = "missing_auth_cmd";
pub const DEADLINE: &str = "deadline";
pub const ACCEPTED: &str = "accepted";

impl SocketMetrics {
    /// Registers the series; those of `routes`, every form's outcomes and
    /// every close reason exist (at 0) from here on.
    pub fn new(metrics: &Metrics, routes: &[&str]) -> SocketMetrics {
        let open = metrics.register_gauge(
            "keygate_websocket_open",
            "WebSockets open now, by route.",
            &["route"],
        );
        let auth = metrics.register_counter(
            "keygate_websocket_auth_total",
            "WebSocket authentications, by form (query_token, header, auth_cmd) and result.",
            &["form", "result"],
        );
        let closes = metrics.register_counter(
            "keygate_websocket_closes_total",
            "WebSockets closed, by reason.",
            &["reason"],
        );
        for route in routes {
            open.with_label_values(&[route]);
        }
        for form in Form::ALL {
            auth.with_label_values(&[form.label(), ACCEPTED]);
            for failure in AuthFailure::ALL {
                auth.with_label_values(&[form.label(), failure.label()]);
            }
        }
        for result in [NO_AUTH_CMD, DEADLINE] {
            auth.with_label_values(&[Form::AuthCmd.label(), result]);
        }
        for ending in Ending::LABELS {
            closes.with_label_values(&[ending]);
        }
        SocketMetrics { open, auth, closes }
    }

    /// Counts a socket open until the returned guard drops.
    pub fn opened(&self, route: &str) -> OpenGuard {
        let gauge = self.open.with_label_values(&[route]);
        gauge.inc();
        OpenGuard(gauge)
    }

    pub fn auth(&self, form: Form, result: &str) {
        self.auth.with_label_values(&[form.label(), result]).inc();
    }

    pub fn closed(&self, ending: &Ending) {
        self.closes.with_label_values(&[ending.label()]).inc();
    }
}

pub struct OpenGuard(prometheus::IntGauge);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
