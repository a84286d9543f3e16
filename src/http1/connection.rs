//! The one reading of a `Connection` header (RFC 9110 section 7.6.1): a
//! comma-separated list of options, each matched without regard to case.

/// The options of a list-valued field, each trimmed of the spaces and tabs
/// around it (RFC 9110 section 5.6.1). Empty elements are given too.
#[inline]
pub fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|b| *b == b',').map(<[u8]>::trim_ascii)
}

/// What the `Connection` headers of a message ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `close`: the connection ends after this message (RFC 9112 section 9.6).
    pub close: bool,
    /// `keep-alive`: an HTTP/1.0 peer keeps the connection.
    pub keep_alive: bool,
    /// `upgrade`: the sender asks to switch protocols.
    pub upgrade: bool,
}

impl Options {
    /// Adds the options of one `Connection` field value (a message may have
    /// several).
    #[inline]
    pub fn read(&mut self, value: &[u8]) {
        for token in tokens(value) {
            self.close |= token.eq_ignore_ascii_case(b"close");
            self.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            self.upgrade |= token.eq_ignore_ascii_case(b"upgrade");
        }
    }

    /// The options of one field value.
    pub fn of(value: &[u8]) -> Options {
        let mut options = Options::default();
        options.read(value);
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_read_in_any_case_and_across_fields() {
        let mut options = Options::of(b"Close, X-Auth-User-Id");
        assert!(options.close && !options.keep_alive && !options.upgrade);
        options.read(b" keep-alive ,\tUPGRADE");
        assert_eq!(
            options,
            Options {
                close: true,
                keep_alive: true,
                upgrade: true
            }
        );
        assert_eq!(
            Options::of(b"closed, x-close, keepalive"),
            Options::default()
        );
    }

    #[test]
    fn list_elements_are_trimmed_and_empty_ones_kept() {
        let got: Vec<&[u8]> = tokens(b" a ,b,, c\t").collect();
        assert_eq!(got, [&b"a"[..], b"b", b"", b"c"]);
    }
}
