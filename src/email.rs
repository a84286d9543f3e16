//! E-mail addresses: the one rule that folds an address for comparison
//! ([`fold`]) and the one rule that says whether an address may name an
//! account ([`check`]). Every comparison of addresses (login, the REST and
//! command-line user endpoints, password reset, invitations, the platform
//! import and its sync, user lookups in the store) goes through [`fold`].
//!
//! The fold is ASCII-only: surrounding ASCII blanks go, `A`-`Z` become
//! `a`-`z`, and nothing else changes. A Unicode lower-casing would fold
//! look-alikes onto ASCII (`\u{212A}` KELVIN SIGN lower-cases to `k`,
//! `\u{130}` to `i` and a dot), so that `\u{212A}elvin@ex.com` would name
//! `kelvin@ex.com`'s account. [`check`] then refuses any address that is
//! not printable ASCII, so no stored address holds a character the fold
//! leaves alone. That is stricter than the platform: its validator (Apache
//! Commons' `EmailValidator`, since 1.5) takes non-ASCII local parts and
//! internationalised domains, and its lookups are case-exact by default
//! (`security.user_login_case_sensitive`). keygate refuses them rather than
//! keep them case-exact: look-alikes from other scripts (a Cyrillic `а` in
//! `аdmin@ex.com`) would name accounts beside the ASCII ones, and mail to
//! them needs SMTPUTF8. Such platform rows are skipped and named.

/// The longest address: the platform's `tb_user.email` is `varchar(255)`.
pub const MAX_LEN: usize = 255;

/// `text` as addresses are compared and stored: surrounding ASCII blanks
/// removed, ASCII letters lower-cased, every other character as it was.
pub fn fold(text: &str) -> String {
    text.trim_ascii().to_ascii_lowercase()
}

/// Whether two addresses name the same account.
pub fn same(a: &str, b: &str) -> bool {
    a.trim_ascii().eq_ignore_ascii_case(b.trim_ascii())
}

/// The folded address, or why it cannot name an account: at most
/// [`MAX_LEN`] bytes, printable ASCII only (no blank, no control character,
/// nothing a look-alike could hide in), one `@` with something before it,
/// and a domain of non-empty dot-separated labels (or `localhost`).
pub fn check(text: &str) -> Result<String, String> {
    let email = fold(text);
    let shown = || email.chars().take(80).collect::<String>();
    if email.len() > MAX_LEN {
        return Err(format!(
            "Invalid email address: longer than {MAX_LEN} characters ({:?}...)",
            shown()
        ));
    }
    let printable = email.bytes().all(|b| b.is_ascii_graphic());
    let shaped = match email.split_once('@') {
        Some((local, domain)) => {
            !local.is_empty()
                && !domain.contains('@')
                && (domain == "localhost"
                    || (domain.contains('.') && domain.split('.').all(|label| !label.is_empty())))
        }
        None => false,
    };
    if printable && shaped {
        Ok(email)
    } else {
        Err(format!("Invalid email address: {:?}", shown()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kelvin_sign_does_not_fold_onto_ascii_k() {
        assert_eq!(fold("\u{212A}elvin@ex.com"), "\u{212A}elvin@ex.com");
        assert_ne!(fold("\u{212A}elvin@ex.com"), fold("kelvin@ex.com"));
        assert!(!same("\u{212A}elvin@ex.com", "Kelvin@ex.com"));
        assert!(check("\u{212A}elvin@ex.com").is_err(), "non-ASCII refused");
        // Other look-alikes that a Unicode lower-casing maps onto ASCII.
        for lookalike in [
            "\u{130}nfo@ex.com",
            "boss@ex.com\u{3000}",
            "bo\u{17F}s@ex.com",
        ] {
            assert_ne!(fold(lookalike), fold("info@ex.com"));
            assert_ne!(fold(lookalike), fold("boss@ex.com"));
            assert!(check(lookalike).is_err(), "{lookalike:?}");
        }
    }

    #[test]
    fn ascii_case_and_surrounding_blanks_fold() {
        assert_eq!(fold(" Boss@Ex.COM\t"), "boss@ex.com");
        assert!(same("Boss@Ex.com", "boss@ex.com "));
        assert_eq!(check(" Admin@Example.COM ").unwrap(), "admin@example.com");
        assert_eq!(
            check("sysadmin@keygate.local").unwrap(),
            "sysadmin@keygate.local"
        );
    }

    #[test]
    fn addresses_that_cannot_name_an_account_are_refused() {
        let long = format!("{}@example.com", "a".repeat(MAX_LEN));
        for bad in [
            "",
            "no-at",
            "@example.com",
            "a b@example.com",
            "not an email",
            "a@nodot",
            "a@b@example.com",
            "a@example..com",
            "evil@example.com\r\nBcc: x@y.z",
            "a\u{0}@example.com",
            long.as_str(),
        ] {
            let error = check(bad).unwrap_err();
            assert!(
                error.starts_with("Invalid email address"),
                "{bad:?}: {error}"
            );
        }
        let exactly = format!("{}@ex.com", "a".repeat(MAX_LEN - 7));
        assert_eq!(exactly.len(), MAX_LEN);
        assert!(check(&exactly).is_ok());
    }
}
