//! The chunked transfer coding (RFC 9112 section 7.1): a decoder that reads
//! a body out of a buffer a piece at a time, and the encoder's two writes.

use bytes::{Buf as _, Bytes, BytesMut};

/// Why a chunked body could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

/// Longest chunk-size line (with extensions) or trailer line read.
const MAX_LINE: usize = 4096;

/// Most hex digits of a chunk size: under 2^60 bytes, so the size never
/// overflows.
const MAX_SIZE_DIGITS: usize = 15;

/// Reads a chunked body: `chunk-size [ chunk-ext ] CRLF chunk-data CRLF`,
/// ended by a zero-size chunk, trailer lines (read and dropped, as hyper's
/// path drops them for a client that did not ask) and an empty line.
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Before a chunk-size line.
    #[default]
    Size,
    /// Within chunk data, this many bytes left.
    Data(u64),
    /// The CRLF after chunk data.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
    /// The body is whole.
    Done,
}

impl Chunked {
    /// Whether the body's last chunk and trailers have been read.
    pub fn done(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// Takes what it can from `buf`: `Ok(Some(data))` for body bytes,
    /// `Ok(None)` when it needs more bytes (or is done), an error for a
    /// malformed chunk.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, ChunkError> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(None),
                ChunkState::Size => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    let size = chunk_size(&line)?;
                    self.state = if size == 0 {
                        ChunkState::Trailers
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (buf.len() as u64).min(left) as usize;
                    let data = buf.split_to(n).freeze();
                    self.state = if left == n as u64 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n as u64)
                    };
                    return Ok(Some(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(None);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(ChunkError("no CRLF after chunk data"));
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(None);
                    };
                    if line.is_empty() {
                        self.state = ChunkState::Done;
                    }
                }
            }
        }
    }
}

/// The size of a chunk-size line (its extensions ignored).
fn chunk_size(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.split(|b| *b == b';').next().unwrap_or_default();
    let digits = digits.trim_ascii_end();
    if digits.is_empty()
        || digits.len() > MAX_SIZE_DIGITS
        || !digits.iter().all(u8::is_ascii_hexdigit)
    {
        return Err(ChunkError("bad chunk size"));
    }
    Ok(digits.iter().fold(0u64, |n, d| {
        n * 16 + u64::from((*d as char).to_digit(16).unwrap_or(0))
    }))
}

/// A CRLF-ended line taken from the front of `buf` (without its CRLF), or
/// `None` while it is not whole. A bare LF or an overlong line is refused.
fn take_line(buf: &mut BytesMut) -> Result<Option<BytesMut>, ChunkError> {
    match buf.iter().position(|b| *b == b'\n') {
        Some(at) => {
            if at == 0 || buf[at - 1] != b'\r' {
                return Err(ChunkError("bare LF"));
            }
            let mut line = buf.split_to(at + 1);
            line.truncate(at - 1);
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(ChunkError("line too long")),
        None => Ok(None),
    }
}

/// Appends `data` as one chunk (its size in upper-case hex), nothing for
/// no data: an empty chunk would end the body.
pub fn write_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = data.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789ABCDEF"[n % 16];
        n /= 16;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Appends the last chunk, with no trailers.
pub fn write_last_chunk(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dechunk(wire: &[u8], step: usize) -> Result<(Vec<u8>, Vec<u8>), ChunkError> {
        let mut decoder = Chunked::default();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in wire.chunks(step.max(1)) {
            buf.extend_from_slice(piece);
            while let Some(data) = decoder.next(&mut buf)? {
                body.extend_from_slice(&data);
            }
            if decoder.done() {
                break;
            }
        }
        assert!(decoder.done(), "not done: {wire:?}");
        Ok((body, buf.to_vec()))
    }

    #[test]
    fn chunked_bodies_are_read_whatever_the_pieces_they_arrive_in() {
        let wire = b"5\r\nfirst\r\n6;ext=1\r\nsecond\r\n0\r\ntrailer: x\r\n\r\nNEXT";
        for step in [1, 2, 3, 7, wire.len()] {
            let (body, rest) = dechunk(wire, step).unwrap();
            assert_eq!(body, b"firstsecond", "step {step}");
            if step == wire.len() {
                assert_eq!(rest, b"NEXT");
            }
        }
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for wire in [
            &b"x\r\nabc\r\n0\r\n\r\n"[..],
            b"3\r\nabcX\r\n0\r\n\r\n",
            b"3\nabc\r\n0\r\n\r\n",
            b"-3\r\nabc\r\n0\r\n\r\n",
            b"ffffffffffffffff\r\n",
            b"\r\n",
        ] {
            let mut decoder = Chunked::default();
            let mut buf = BytesMut::from(wire);
            let mut failed = false;
            for _ in 0..8 {
                match decoder.next(&mut buf) {
                    Err(_) => {
                        failed = true;
                        break;
                    }
                    Ok(None) => break,
                    Ok(Some(_)) => {}
                }
            }
            assert!(failed, "{wire:?}");
        }
    }

    #[test]
    fn chunks_are_written_with_upper_case_hex_sizes_and_a_last_chunk() {
        let mut out = Vec::new();
        write_chunk(b"", &mut out);
        write_chunk(b"hello", &mut out);
        write_chunk(&[b'x'; 0x1AF], &mut out);
        write_last_chunk(&mut out);
        let mut expected = b"5\r\nhello\r\n1AF\r\n".to_vec();
        expected.extend_from_slice(&[b'x'; 0x1AF]);
        expected.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(out, expected);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any body, chunked in any sizes and fed in any pieces, comes
            /// back whole; the bytes after it are left in the buffer.
            #[test]
            fn any_chunking_of_any_body_decodes_to_that_body(
                body in proptest::collection::vec(any::<u8>(), 0..600),
                sizes in proptest::collection::vec(1usize..50, 1..20),
                step in 1usize..64,
            ) {
                let mut wire = Vec::new();
                let mut at = 0;
                let mut i = 0;
                while at < body.len() {
                    let n = sizes[i % sizes.len()].min(body.len() - at);
                    wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    wire.extend_from_slice(&body[at..at + n]);
                    wire.extend_from_slice(b"\r\n");
                    at += n;
                    i += 1;
                }
                wire.extend_from_slice(b"0\r\n\r\nREST");
                let mut decoder = Chunked::default();
                let mut buf = BytesMut::new();
                let mut got = Vec::new();
                for piece in wire.chunks(step) {
                    buf.extend_from_slice(piece);
                    while let Some(data) = decoder.next(&mut buf).unwrap() {
                        got.extend_from_slice(&data);
                    }
                }
                prop_assert!(decoder.done());
                prop_assert_eq!(got, body);
                prop_assert_eq!(&buf[..], b"REST");
            }

            /// Any bytes: the chunk reader answers (never panics).
            #[test]
            fn the_chunk_reader_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let mut decoder = Chunked::default();
                let mut buf = BytesMut::from(&bytes[..]);
                for _ in 0..64 {
                    match decoder.next(&mut buf) {
                        Ok(Some(_)) => {}
                        _ => break,
                    }
                }
            }
        }
    }
}
