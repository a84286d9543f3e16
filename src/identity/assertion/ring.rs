//! The key set every replica shares through the store: the current signing
//! key, and the keys the JWKS publishes (the current one, and each retired
//! one until every assertion it signed has expired). Reloaded from the store
//! periodically, so a rotation made by another replica or by
//! `keygate assertion rotate` takes effect everywhere.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;

use super::keys::{KeyError, PublicKey, SigningKey, public_of};
use crate::config::AssertionSettings;
use crate::store::{SigningKeyRecord, Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the store holds no current assertion signing key")]
    NoCurrentKey,
    #[error(
        "the store's current assertion signing key {0} is kept in a file this replica does not \
         have; set assertion.signing_key_file to it, or rotate to a generated key"
    )]
    KeyInAnotherFile(String),
}

/// What requests read: the key that signs, and the JWKS document.
pub struct Keys {
    pub signer: Arc<SigningKey>,
    /// `{"keys":[...]}`, built once per reload.
    pub jwks: Bytes,
}

/// The shared key set of this replica.
pub struct KeyRing {
    keys: ArcSwap<Keys>,
    store: Store,
    /// The key of `assertion.signing_key_file`, when set.
    file: Option<Arc<SigningKey>>,
    /// How long a retired key stays published.
    grace: Duration,
    reload: Duration,
}

/// The time between two reloads of the key set: half the JWKS cache time,
/// at most 30 s, at least 1 s.
pub fn reload_interval(settings: &AssertionSettings) -> Duration {
    (settings.jwks_max_age / 2).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// How long a retired key stays published after it was retired: a replica
/// may sign with it until it reloads, its last assertion lives one lifetime,
/// and a verifier may hold a JWKS without it (fetched before the new key
/// was) for one cache time.
pub fn publish_grace(settings: &AssertionSettings) -> Duration {
    reload_interval(settings) + settings.lifetime + settings.jwks_max_age
}

impl KeyRing {
    /// The key set at start: the key file's, made current in the store when
    /// it is not yet; else the stored current key, generated and stored on
    /// the first start (replicas starting at once all end with the one key
    /// that was stored first).
    pub async fn open(store: &Store, settings: &AssertionSettings) -> Result<KeyRing, RingError> {
        let now = crate::clock::now_ms();
        let file = match &settings.signing_key_file {
            Some(path) => {
                let key = SigningKey::from_pem_file(path)?;
                let records = store.signing_keys().await?;
                let current = current_record(&records).map(|r| r.kid.as_str());
                if current != Some(key.public.kid.as_str()) {
                    store
                        .rotate_signing_key(&key.record(false, now), now)
                        .await?;
                    tracing::info!(kid = %key.public.kid, "assertion signing key from the key file made current");
                }
                Some(Arc::new(key))
            }
            None => {
                if current_record(&store.signing_keys().await?).is_none() {
                    let key = SigningKey::generate(settings.algorithm)?;
                    if store
                        .insert_signing_key_if_none(&key.record(true, now))
                        .await?
                    {
                        tracing::info!(kid = %key.public.kid, "assertion signing key generated");
                    }
                }
                None
            }
        };
        let grace = publish_grace(settings);
        let records = store.signing_keys().await?;
        let keys = build(&records, file.as_ref(), None, grace, now)?;
        Ok(KeyRing {
            keys: ArcSwap::from_pointee(keys),
            store: store.clone(),
            file,
            grace,
            reload: reload_interval(settings),
        })
    }

    /// The keys in force.
    pub fn load(&self) -> arc_swap::Guard<Arc<Keys>> {
        self.keys.load()
    }

    /// Reads the key set from the store again; on failure, the keys in force
    /// stay.
    pub async fn reload(&self) -> Result<(), RingError> {
        let now = crate::clock::now_ms();
        let records = self.store.signing_keys().await?;
        let signer = self.keys.load().signer.clone();
        let keys = build(&records, self.file.as_ref(), Some(&signer), self.grace, now)?;
        if keys.signer.public.kid != signer.public.kid {
            tracing::info!(kid = %keys.signer.public.kid, previous = %signer.public.kid, "assertion signing key rotated");
        }
        self.keys.store(Arc::new(keys));
        // Keys no verifier can need any more: retired for twice as long as
        // they stay published.
        let before = now - 2 * self.grace.as_millis() as i64;
        self.store
            .delete_signing_keys_retired_before(before)
            .await?;
        Ok(())
    }

    /// Reloads every reload interval until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.reload);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(error) = self.reload().await {
                        tracing::warn!(%error, "reloading the assertion signing keys failed; the keys in force stay");
                    }
                }
                _ = stop.changed() => return,
            }
        }
    }
}

/// What [`rotate`] did.
#[derive(Debug)]
pub struct Rotated {
    /// The kid of the new current key.
    pub current: String,
    /// The kid of the key it retired, if one was current.
    pub retired: Option<String>,
}

/// Makes a new generated key of `algorithm` current and retires the one that
/// was; every replica signs with it after its next reload. The audit event
/// is recorded when `store` records one ([`Store::audited`]).
pub async fn rotate(
    store: &Store,
    algorithm: crate::config::AssertionAlgorithm,
) -> Result<Rotated, RingError> {
    let now = crate::clock::now_ms();
    let key = SigningKey::generate(algorithm)?;
    let retired = store
        .rotate_signing_key(&key.record(true, now), now)
        .await?;
    Ok(Rotated {
        current: key.public.kid.clone(),
        retired,
    })
}

fn current_record(records: &[SigningKeyRecord]) -> Option<&SigningKeyRecord> {
    records.iter().find(|r| r.retired_time == 0)
}

/// The keys in force from the stored records: the signer (the file's key;
/// else the current record's, reusing `known` when it is the same key), and
/// the JWKS of the current key and the retired keys still in their grace.
fn build(
    records: &[SigningKeyRecord],
    file: Option<&Arc<SigningKey>>,
    known: Option<&Arc<SigningKey>>,
    grace: Duration,
    now_ms: i64,
) -> Result<Keys, RingError> {
    let signer = match file {
        Some(key) => key.clone(),
        None => {
            let current = current_record(records).ok_or(RingError::NoCurrentKey)?;
            match known.filter(|k| k.public.kid == current.kid) {
                Some(known) => known.clone(),
                None => Arc::new(
                    SigningKey::from_record(current)?
                        .ok_or_else(|| RingError::KeyInAnotherFile(current.kid.clone()))?,
                ),
            }
        }
    };
    let grace_ms = grace.as_millis() as i64;
    let mut published: Vec<PublicKey> = vec![signer.public.clone()];
    for record in records {
        let live = record.retired_time == 0 || record.retired_time + grace_ms > now_ms;
        if !live || published.iter().any(|p| p.kid == record.kid) {
            continue;
        }
        match public_of(record) {
            Some(public) => published.push(public),
            None => {
                tracing::warn!(kid = %record.kid, "a stored assertion key is corrupt; not published")
            }
        }
    }
    let jwks = serde_json::json!({
        "keys": published.iter().map(PublicKey::jwk).collect::<Vec<_>>(),
    });
    Ok(Keys {
        signer,
        jwks: Bytes::from(jwks.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AssertionAlgorithm;

    fn record(key: &SigningKey, created: i64, retired: i64) -> SigningKeyRecord {
        SigningKeyRecord {
            created_time: created,
            retired_time: retired,
            ..key.record(true, created)
        }
    }

    fn kids(keys: &Keys) -> Vec<String> {
        let jwks: serde_json::Value = serde_json::from_slice(&keys.jwks).unwrap();
        jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kid"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_retired_key_is_published_for_its_grace_then_dropped() {
        let old = SigningKey::generate(AssertionAlgorithm::Es256).unwrap();
        let new = SigningKey::generate(AssertionAlgorithm::EdDsa).unwrap();
        let records = vec![record(&new, 2_000, 0), record(&old, 1_000, 2_000)];
        let grace = Duration::from_secs(10);
        let within = build(&records, None, None, grace, 11_999).unwrap();
        assert_eq!(within.signer.public.kid, new.public.kid);
        assert_eq!(
            kids(&within),
            [new.public.kid.clone(), old.public.kid.clone()]
        );
        let after = build(&records, None, None, grace, 12_000).unwrap();
        assert_eq!(kids(&after), [new.public.kid]);
    }

    #[test]
    fn the_key_file_signs_whatever_the_store_says_is_current() {
        let file = Arc::new(SigningKey::generate(AssertionAlgorithm::Es256).unwrap());
        let stored = SigningKey::generate(AssertionAlgorithm::Es256).unwrap();
        let records = vec![record(&stored, 1, 0)];
        let keys = build(&records, Some(&file), None, Duration::ZERO, 5).unwrap();
        assert_eq!(keys.signer.public.kid, file.public.kid);
        assert_eq!(
            kids(&keys),
            [file.public.kid.clone(), stored.public.kid.clone()]
        );
    }

    #[test]
    fn a_current_key_kept_in_a_file_elsewhere_is_a_clear_error() {
        let elsewhere = SigningKey::generate(AssertionAlgorithm::Es256).unwrap();
        let records = vec![SigningKeyRecord {
            private_key: String::new(),
            ..record(&elsewhere, 1, 0)
        }];
        let error = build(&records, None, None, Duration::ZERO, 5)
            .err()
            .unwrap();
        assert!(matches!(error, RingError::KeyInAnotherFile(kid) if kid == elsewhere.public.kid));
        assert!(matches!(
            build(&[], None, None, Duration::ZERO, 5),
            Err(RingError::NoCurrentKey)
        ));
    }

    #[test]
    fn reload_intervals_follow_the_jwks_cache_time_within_bounds() {
        let settings = |max_age: u64| AssertionSettings {
            issuer: "keygate".into(),
            lifetime: Duration::from_secs(300),
            algorithm: AssertionAlgorithm::Es256,
            signing_key_file: None,
            jwks_max_age: Duration::from_secs(max_age),
            reuse: true,
        };
        assert_eq!(reload_interval(&settings(300)), Duration::from_secs(30));
        assert_eq!(reload_interval(&settings(20)), Duration::from_secs(10));
        assert_eq!(reload_interval(&settings(1)), Duration::from_secs(1));
        assert_eq!(
            publish_grace(&settings(20)),
            Duration::from_secs(10 + 300 + 20)
        );
    }
}
