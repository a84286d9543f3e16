//! How a verified identity travels to an upstream, chosen per route
//! ([`IdentityMode`]): as the `X-Auth-*` headers alone, with a signed
//! assertion besides them, or as the platform's own access token. What a
//! route's mode adds to the request head is its [`Passport`], issued by
//! [`Passports`].

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use prometheus::IntCounter;
use uuid::Uuid;

use super::{Identity, X_AUTHORIZATION};
use crate::error::ApiError;
use crate::table::Table;
use crate::telemetry::Metrics;
pub use crate::vocab::identity::IdentityMode;

pub static X_AUTH_ASSERTION: HeaderName = HeaderName::from_static("x-auth-assertion");

/// The one header a route's mode adds beyond the `X-Auth-*` headers. It is
/// set by the proxy's header step (`to_upstream`) after every header a client
/// could have used to claim an identity is removed.
#[derive(Debug, Clone)]
pub struct Passport {
    pub name: &'static HeaderName,
    pub value: HeaderValue,
}

/// A route as far as issuing its passports needs it: its mode, its
/// audience, and its counters of passports issued and reused
/// (`keygate_upstream_identity_total`).
#[derive(Clone)]
pub struct Destination {
    pub mode: IdentityMode,
    /// The `aud` of its assertions.
    pub audience: Arc<str>,
    /// Issued and reused; none on a `headers` route, which issues none.
    counters: Option<[IntCounter; 2]>,
}

impl Destination {
    pub fn new(mode: IdentityMode, audience: &str, route: &str, metrics: &Metrics) -> Destination {
        Destination {
            mode,
            audience: Arc::from(audience),
            counters: (mode != IdentityMode::Headers)
                .then(|| metrics.passport_series(route, mode.as_str())),
        }
    }
}

/// Signs one passport of a mode: an assertion, or a platform token.
pub trait Minter: Send + Sync {
    /// A new passport of `identity` for a route whose audience is `audience`.
    fn mint(&self, audience: &str, identity: &Identity) -> Result<HeaderValue, ApiError>;
    /// How long a minted passport is valid.
    fn lifetime(&self) -> Duration;
    /// Signs with a new key (and issuer) from now on; false when the minter
    /// has no key that changes, or the key is the one in use.
    fn rekey(&self, _key: &[u8], _issuer: &str) -> bool {
        false
    }
    /// May a passport serve several requests until most of its lifetime is
    /// spent? `false`: each request gets one of its own.
    fn reusable(&self) -> bool {
        true
    }
}

/// What a passport is reused by: the credential it was issued for, the
/// mode and the audience. The audience is shared with the route, so
/// building a key copies no text.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Reuse {
    credential: Uuid,
    mode: IdentityMode,
    audience: Arc<str>,
}

/// A passport kept for reuse, with its owner so a user's revocation finds it.
#[derive(Clone)]
struct Issued {
    user_id: Uuid,
    value: HeaderValue,
}

/// Passports are reused until this share of their lifetime is spent, so an
/// upstream never receives one about to expire in transit.
const REUSE_SHARE: f64 = 0.9;

/// Issues the passports of every route, reusing each until most of its
/// lifetime is spent, in a bounded cache that revocation clears like the
/// credential caches (which hold it, and forget what they forget here).
pub struct Passports {
    assertion: Option<Box<dyn Minter>>,
    platform: Option<Box<dyn Minter>>,
    reused: Table<Reuse, Issued>,
}

impl Passports {
    /// No minters yet: `headers` routes only.
    pub fn new(capacity: u64, metrics: &Metrics) -> Passports {
        Passports {
            assertion: None,
            platform: None,
            reused: Table::new(capacity, metrics.init_cache("passports")),
        }
    }

    /// With the minter of the platform's access tokens, for `platform`
    /// routes.
    pub fn with_platform(mut self, minter: Box<dyn Minter>) -> Passports {
        self.platform = Some(minter);
        self
    }

    /// Signs the assertions of `assertion` routes with `minter`.
    pub fn with_assertion(mut self, minter: Box<dyn Minter>) -> Passports {
        self.assertion = Some(minter);
        self
    }

    /// The passport `identity` carries to `destination`; `None` on a
    /// `headers` route.
    pub fn issue(
        &self,
        destination: &Destination,
        identity: &Identity,
    ) -> Result<Option<Passport>, ApiError> {
        let (minter, name) = match destination.mode {
            IdentityMode::Headers => return Ok(None),
            IdentityMode::Assertion => (&self.assertion, &X_AUTH_ASSERTION),
            IdentityMode::Platform => (&self.platform, &X_AUTHORIZATION),
        };
        // Validation refuses such a route at start; never forward without.
        let (Some(minter), Some([issued, reused])) = (minter.as_deref(), &destination.counters)
        else {
            return Err(ApiError::internal());
        };
        if !minter.reusable() {
            // Neither looked up nor kept: one passport per request.
            let value = minter.mint(&destination.audience, identity)?;
            issued.inc();
            return Ok(Some(Passport { name, value }));
        }
        let key = Reuse {
            credential: identity.credential_id(),
            mode: destination.mode,
            audience: destination.audience.clone(),
        };
        if let Some(kept) = self.reused.get(&key) {
            reused.inc();
            return Ok(Some(Passport {
                name,
                value: kept.value,
            }));
        }
        let value = minter.mint(&destination.audience, identity)?;
        issued.inc();
        self.reused.insert(
            key,
            Issued {
                user_id: identity.principal.user_id,
                value: value.clone(),
            },
            minter.lifetime().mul_f64(REUSE_SHARE),
        );
        Ok(Some(Passport { name, value }))
    }

    /// Forgets every passport issued for a key or a session.
    pub(crate) fn forget_credential(&self, id: Uuid) {
        self.reused
            .invalidate_if(move |key, _| key.credential == id);
    }

    /// Forgets every passport of a user.
    pub(crate) fn forget_user(&self, id: Uuid) {
        self.reused
            .invalidate_if(move |_, issued| issued.user_id == id);
    }

    pub(crate) fn clear(&self) {
        self.reused.clear();
    }

    /// The platform rotated its signing key: platform tokens are signed
    /// with `key` from now on, and those kept for reuse, signed with the
    /// old key the platform no longer accepts, are dropped. False when
    /// there is no platform minter or the key is the one in use.
    pub fn rekey_platform(&self, key: &[u8], issuer: &str) -> bool {
        let rekeyed = self
            .platform
            .as_deref()
            .is_some_and(|minter| minter.rekey(key, issuer));
        if rekeyed {
            self.reused
                .invalidate_if(|reuse, _| reuse.mode == IdentityMode::Platform);
        }
        rekeyed
    }

    pub(crate) fn len(&self) -> u64 {
        self.reused.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_modes_parse_from_their_setting() {
        for mode in [
            IdentityMode::Headers,
            IdentityMode::Assertion,
            IdentityMode::Platform,
        ] {
            assert_eq!(IdentityMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(IdentityMode::parse(""), Some(IdentityMode::Headers));
        assert_eq!(IdentityMode::parse("Headers"), None);
        assert_eq!(IdentityMode::parse("bearer"), None);
    }

    /// Signs `n` for the nth passport, and says whether it may be reused.
    struct Counting {
        minted: std::sync::atomic::AtomicU32,
        reuse: bool,
    }

    impl Minter for Counting {
        fn mint(&self, _audience: &str, _identity: &Identity) -> Result<HeaderValue, ApiError> {
            let n = self
                .minted
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(HeaderValue::from(n))
        }

        fn lifetime(&self) -> Duration {
            Duration::from_secs(300)
        }

        fn reusable(&self) -> bool {
            self.reuse
        }
    }

    fn key_identity() -> Identity {
        let principal = std::sync::Arc::new(super::super::Principal::new(
            Uuid::from_u128(1),
            Uuid::from_u128(2),
            super::super::NULL_UUID,
            super::super::Authority::TenantAdmin,
            "ta@example.com".into(),
        ));
        let key_id = Uuid::from_u128(3);
        Identity::new(
            principal,
            super::super::AuthMethod::ApiKey { key_id },
            super::super::id_header_value(&key_id),
        )
    }

    /// Three requests of one key to one `assertion` route: the values sent.
    fn three_assertions(reuse: bool) -> Vec<HeaderValue> {
        let metrics = Metrics::new();
        let passports = Passports::new(100, &metrics).with_assertion(Box::new(Counting {
            minted: Default::default(),
            reuse,
        }));
        let destination = Destination::new(IdentityMode::Assertion, "billing", "billing", &metrics);
        let identity = key_identity();
        (0..3)
            .map(|_| {
                let passport = passports.issue(&destination, &identity).unwrap().unwrap();
                assert_eq!(passport.name, &X_AUTH_ASSERTION);
                passport.value
            })
            .collect()
    }

    #[test]
    fn with_reuse_off_every_request_carries_an_assertion_of_its_own() {
        let reused = three_assertions(true);
        assert!(reused.iter().all(|v| v == "0"), "{reused:?}");
        let fresh = three_assertions(false);
        assert_eq!(fresh, ["0", "1", "2"]);
    }
}
