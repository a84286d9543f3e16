//! How authentication outcomes are counted: the `(method, result)` pairs of
//! `keygate_auth_total` that can happen, created at 0 at startup, and the
//! request path's handles to them.

use crate::telemetry::{AUTH_METHODS, AuthSeries, Metrics};

use super::AuthFailure;
use super::credential::Credential;

/// Credential methods, as indices into [`AUTH_METHODS`].
pub const API_KEY: usize = 0;
pub const JWT: usize = 1;
pub const NO_CREDENTIAL: usize = 2;

/// The method a credential is counted under; [`NO_CREDENTIAL`] when none
/// was read. The one mapping for requests and WebSockets.
pub fn method_of(credential: Option<&Credential>) -> usize {
    match credential {
        Some(Credential::ApiKey(_)) => API_KEY,
        Some(Credential::Bearer(_)) => JWT,
        None => NO_CREDENTIAL,
    }
}

/// Result labels: `accepted`, then each failure in [`AuthFailure::ALL`] order
/// (a test keeps the two in step).
const RESULTS: [&str; 1 + AuthFailure::ALL.len()] = [
    "accepted",
    "missing",
    "malformed",
    "unknown",
    "disabled",
    "expired",
    "outdated",
    "expired",
    "bad_signature",
    "wrong_scope",
    "plaintext_refused",
    "store_error",
    "rate_limited",
    "out_of_scope",
    "second_factor_pending",
];

/// The request path's authentication counters.
pub struct Outcomes {
    series: AuthSeries,
}

impl Outcomes {
    /// Resolves the counters, and creates at 0 every outcome that can happen:
    /// each method with every failure it can meet, parse failures under
    /// `none`, and a password sent in clear.
    pub fn new(metrics: &Metrics) -> Outcomes {
        for method in [AUTH_METHODS[API_KEY], AUTH_METHODS[JWT]] {
            metrics.init_auth(method, RESULTS[0]);
            for failure in AuthFailure::ALL.iter().filter(|f| !f.is_parse_failure()) {
                // Only an API key has scopes; only a token waits for a
                // second factor.
                let possible = match failure {
                    AuthFailure::OutOfScope => method == AUTH_METHODS[API_KEY],
                    AuthFailure::SecondFactorPending => method == AUTH_METHODS[JWT],
                    _ => true,
                };
                if possible {
                    metrics.init_auth(method, failure.label());
                }
            }
        }
        for failure in AuthFailure::ALL.iter().filter(|f| f.is_parse_failure()) {
            metrics.init_auth(AUTH_METHODS[NO_CREDENTIAL], failure.label());
        }
        metrics.init_auth("password", AuthFailure::PlaintextRefused.label());
        Outcomes {
            series: metrics.auth_series(&RESULTS),
        }
    }

    /// Counts one outcome of `method` (an index into [`AUTH_METHODS`]).
    pub fn count(&self, method: usize, outcome: Result<(), AuthFailure>) {
        let result = match outcome {
            Ok(()) => 0,
            Err(failure) => 1 + failure as usize,
        };
        self.series.count(method, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::AuthMethod;

    #[test]
    fn result_labels_follow_the_failures_in_order() {
        for (index, failure) in AuthFailure::ALL.iter().enumerate() {
            assert_eq!(index, *failure as usize, "{failure:?} out of order");
            assert_eq!(RESULTS[1 + index], failure.label(), "{failure:?}");
        }
    }

    #[test]
    fn credential_methods_count_under_the_labels_logs_and_headers_use() {
        let key = AuthMethod::ApiKey {
            key_id: uuid::Uuid::nil(),
        };
        let jwt = AuthMethod::Jwt {
            session_id: uuid::Uuid::nil(),
        };
        assert_eq!(AUTH_METHODS[API_KEY], key.label());
        assert_eq!(AUTH_METHODS[JWT], jwt.label());
        assert_eq!(AUTH_METHODS[NO_CREDENTIAL], "none");
    }

    #[test]
    fn outcomes_that_can_happen_are_zero_before_the_first_one() {
        let metrics = Metrics::new();
        let outcomes = Outcomes::new(&metrics);
        let text = metrics.render();
        for series in [
            r#"keygate_auth_total{method="api-key",result="accepted"} 0"#,
            r#"keygate_auth_total{method="jwt",result="expired"} 0"#,
            r#"keygate_auth_total{method="none",result="missing"} 0"#,
            r#"keygate_auth_total{method="api-key",result="out_of_scope"} 0"#,
            r#"keygate_auth_total{method="password",result="plaintext_refused"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
        assert!(
            !text.contains(r#"method="none",result="accepted""#),
            "only outcomes that can happen"
        );
        outcomes.count(JWT, Err(AuthFailure::TokenExpired));
        outcomes.count(API_KEY, Ok(()));
        let text = metrics.render();
        assert!(text.contains(r#"keygate_auth_total{method="jwt",result="expired"} 1"#));
        assert!(text.contains(r#"keygate_auth_total{method="api-key",result="accepted"} 1"#));
    }
}
