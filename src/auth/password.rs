//! Password hashing: Argon2id for new hashes, run on the blocking pool.
//!
//! Parameters (OWASP's recommendation for Argon2id): 19 MiB memory, 2 passes,
//! 1 lane, 32-byte output, 16-byte random salt, PHC string format. bcrypt
//! hashes (`$2a$`, `$2b$`, `$2y$`) of imported users are verified too, and
//! re-hashed with Argon2id on the next successful login.

use argon2::{Algorithm, Argon2, Params, PasswordHasher, PasswordVerifier, Version};

pub const MEMORY_KIB: u32 = 19 * 1024;
pub const ITERATIONS: u32 = 2;
pub const LANES: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    #[error("password hashing failed: {0}")]
    Hash(String),
    #[error("password hashing task failed")]
    Join,
}

fn hasher() -> Argon2<'static> {
    let params = Params::new(MEMORY_KIB, ITERATIONS, LANES, Some(32))
        .expect("static argon2 params are valid");
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
}

/// Hashes a password with Argon2id, synchronously. Prefer [`hash`] on async paths.
pub fn hash_blocking(password: &str) -> Result<String, PasswordError> {
    hasher()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
}

/// Checks a password against a stored Argon2id or bcrypt hash, synchronously.
/// An unparsable hash is a mismatch, never a panic.
pub fn verify_blocking(password: &str, stored: &str) -> bool {
    if is_bcrypt(stored) {
        return bcrypt::verify(password, stored).unwrap_or(false);
    }
    hasher()
        .verify_password(password.as_bytes(), stored)
        .is_ok()
}

fn is_bcrypt(stored: &str) -> bool {
    ["$2a$", "$2b$", "$2y$"]
        .iter()
        .any(|p| stored.starts_with(p))
}

/// True when a stored hash is not in the current scheme and should be
/// replaced after the next successful login.
pub fn needs_rehash(stored: &str) -> bool {
    !stored.starts_with("$argon2id$v=19$m=19456,t=2,p=1$")
}

/// Hashes on the blocking pool, so async workers keep proxying.
pub async fn hash(password: String) -> Result<String, PasswordError> {
    tokio::task::spawn_blocking(move || hash_blocking(&password))
        .await
        .map_err(|_| PasswordError::Join)?
}

/// Verifies on the blocking pool.
pub async fn verify(password: String, stored: String) -> Result<bool, PasswordError> {
    tokio::task::spawn_blocking(move || verify_blocking(&password, &stored))
        .await
        .map_err(|_| PasswordError::Join)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argon2id_hash_verifies_and_rejects_wrong_password() {
        let stored = hash_blocking("correct horse").unwrap();
        assert!(
            stored.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{stored}"
        );
        assert!(verify_blocking("correct horse", &stored));
        assert!(!verify_blocking("wrong horse", &stored));
        assert!(!verify_blocking("correct horse", "not a hash"));
    }

    #[test]
    fn imported_bcrypt_hashes_verify_and_need_rehash() {
        let stored = bcrypt::hash("imported-secret", 4).unwrap();
        assert!(stored.starts_with("$2b$"));
        assert!(verify_blocking("imported-secret", &stored));
        assert!(!verify_blocking("wrong", &stored));
        let as_2a = stored.replacen("$2b$", "$2a$", 1);
        assert!(verify_blocking("imported-secret", &as_2a));
        assert!(needs_rehash(&stored));
        assert!(!needs_rehash(&hash_blocking("fresh-password").unwrap()));
    }

    #[tokio::test]
    async fn hashing_runs_off_the_async_workers() {
        let stored = hash("pw-on-blocking-pool".into()).await.unwrap();
        assert!(verify("pw-on-blocking-pool".into(), stored).await.unwrap());
    }
}
