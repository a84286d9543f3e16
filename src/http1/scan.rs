//! Spotting ambiguous HTTP/1 framing on the wire (the CL+TE scan).
//!
//! A request head with both `Content-Length` and `Transfer-Encoding` can be read
//! two ways, the classic setup for request smuggling. hyper reads it as chunked,
//! drops `Content-Length` from the parsed head and closes the connection after
//! the response, so the request that reaches keygate's handler no longer shows
//! the conflict. keygate's rule is to refuse such a request, not to repair it;
//! this scanner watches the bytes hyper reads and remembers that a head block
//! named both, so the handler can refuse a request that carries
//! `Transfer-Encoding` on a connection where that was seen
//! (the listener marks such a request).
//!
//! It looks at line starts only: per byte it compares at most the first 18
//! bytes of a line, and a block of header lines ends at an empty line. A body
//! that itself contains a line-wise header block naming both is taken for one;
//! that only matters for a chunked request on the same connection, and errs on
//! the side of refusing.

const CONTENT_LENGTH: &[u8] = b"content-length:";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding:";
/// The longest line prefix compared.
const PREFIX: usize = 18;

/// Line-start state across reads.
#[derive(Debug, Default)]
pub struct FramingScanner {
    line: [u8; PREFIX],
    /// Bytes of the current line seen so far (compared up to [`PREFIX`]).
    len: usize,
    content_length: bool,
    transfer_encoding: bool,
    /// A block named both: sticky for the connection.
    ambiguous: bool,
}

impl FramingScanner {
    /// Feeds the next bytes read from the connection.
    ///
    /// Only a line's first bytes are looked at: the rest of it, a body's
    /// bytes above all, is skipped to the next line feed by `memchr`. Byte
    /// by byte, this scan was 22% of keygate's CPU time under a stream of
    /// 1 MiB uploads (`perf`, `benches/run`'s upload case).
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if self.ambiguous {
            return;
        }
        loop {
            let end = memchr::memchr(b'\n', bytes);
            let part = &bytes[..end.unwrap_or(bytes.len())];
            let seen = self.len.min(PREFIX);
            for (slot, &b) in self.line[seen..].iter_mut().zip(part) {
                *slot = b.to_ascii_lowercase();
            }
            self.len = self.len.saturating_add(part.len());
            let Some(end) = end else { return };
            self.end_line();
            bytes = &bytes[end + 1..];
        }
    }

    fn end_line(&mut self) {
        let len = self.len.min(PREFIX);
        let line = &self.line[..len];
        if self.len == 0 || (self.len == 1 && line == b"\r") {
            // An empty line ends a block of header lines.
            self.content_length = false;
            self.transfer_encoding = false;
        } else if line.starts_with(CONTENT_LENGTH) {
            self.content_length = true;
        } else if line.starts_with(TRANSFER_ENCODING) {
            self.transfer_encoding = true;
        }
        self.ambiguous |= self.content_length && self.transfer_encoding;
        self.len = 0;
    }

    /// Did any head block on this connection name both lengths?
    pub fn ambiguous(&self) -> bool {
        self.ambiguous
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(chunks: &[&[u8]]) -> bool {
        let mut scanner = FramingScanner::default();
        for chunk in chunks {
            scanner.feed(chunk);
        }
        scanner.ambiguous()
    }

    #[test]
    fn a_head_with_both_lengths_is_ambiguous_in_either_order_and_any_case() {
        assert!(scan(&[
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(scan(&[
            b"POST /x HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\ncontent-length: 4\r\n\r\n"
        ]));
    }

    #[test]
    fn lines_split_across_reads_are_still_recognised() {
        let head = b"POST /x HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
        for cut in 1..head.len() {
            assert!(scan(&[&head[..cut], &head[cut..]]), "cut at {cut}");
        }
    }

    #[test]
    fn long_lines_and_bodies_without_line_feeds_are_skipped_whole() {
        let long = [b'x'; 70_000];
        assert!(!scan(&[
            b"POST /a HTTP/1.1\r\nContent-Length: 70000\r\n\r\n",
            &long
        ]));
        // A line start after a long line is still read from its first byte.
        assert!(scan(&[
            b"POST /a HTTP/1.1\r\nX-Long: ",
            &long,
            b"\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        // A name longer than the compared prefix is not one of the two.
        assert!(!scan(&[
            b"POST /a HTTP/1.1\r\nContent-Lengthy: 4\r\nTransfer-Encodingz: x\r\n\r\n"
        ]));
    }

    #[test]
    fn separate_requests_with_one_length_each_are_not_ambiguous() {
        assert!(!scan(&[
            b"POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nok",
            b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            b"GET /c HTTP/1.1\r\nX-Content-Length: 1\r\nX-Transfer-Encoding: x\r\n\r\n",
        ]));
    }
}
