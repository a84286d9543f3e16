//! FNV-1a: a hasher for maps whose keys are all keygate's own (the
//! configured upstreams' authorities, the owned endpoints' path stems).
//!
//! The standard library's SipHash protects a map that a client fills from
//! keys chosen to collide; these maps are filled only from configuration
//! and code, and a client's key at most costs one lookup's probes in a map
//! it cannot grow. SipHash there cost about 3% of the instructions of a
//! proxied request (BENCHMARKS.md, "Instructions per request"): an
//! `Authority` is hashed one byte per call, and each call is a SipHash round.
//! Never use it for a map a client's input can add to.

use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a over 64 bits.
#[derive(Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The `BuildHasher` of maps keyed by keygate's own values.
pub type OwnKeys = BuildHasherDefault<Fnv>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn it_is_fnv_1a() {
        // The published test vectors of 64-bit FNV-1a.
        let hash = |bytes: &[u8]| {
            let mut h = Fnv::default();
            h.write(bytes);
            h.finish()
        };
        assert_eq!(hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash(b"foobar"), 0x8594_4171_f739_67e8);
        let authority: http::uri::Authority = "Up.example:80".parse().unwrap();
        let same: http::uri::Authority = "up.EXAMPLE:80".parse().unwrap();
        assert_eq!(
            OwnKeys::default().hash_one(&authority),
            OwnKeys::default().hash_one(&same)
        );
    }
}
