//! MMDS V2 session tokens: 32 random bytes from getrandom, written as hex, each with its
//! expiry. The table is bounded: a guest that asks for tokens in a loop pushes out the
//! ones that expire soonest, it never grows the VMM.

use std::time::{Duration, Instant};

pub const MIN_TTL_SECONDS: u32 = 1;
pub const MAX_TTL_SECONDS: u32 = 21600;
/// Live tokens kept at once.
const MAX_TOKENS: usize = 1024;
const TOKEN_BYTES: usize = 32;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "Invalid time to live value provided for token: {0}. Please provide a value between {MIN_TTL_SECONDS} and {MAX_TTL_SECONDS}."
    )]
    Ttl(u32),
    #[error("Failed to generate a token: {0}")]
    Random(String),
}

#[derive(Default)]
pub struct Tokens {
    live: Vec<([u8; TOKEN_BYTES], Instant)>,
}

impl Tokens {
    /// A new token valid for `ttl_seconds` from `now`.
    pub fn issue(&mut self, ttl_seconds: u32, now: Instant) -> Result<String, TokenError> {
        if !(MIN_TTL_SECONDS..=MAX_TTL_SECONDS).contains(&ttl_seconds) {
            return Err(TokenError::Ttl(ttl_seconds));
        }
        let mut secret = [0u8; TOKEN_BYTES];
        // SAFETY: getrandom writes at most `secret.len()` bytes into the buffer it is given.
        let n = unsafe { libc::getrandom(secret.as_mut_ptr().cast(), secret.len(), 0) };
        if n != TOKEN_BYTES as isize {
            return Err(TokenError::Random(std::io::Error::last_os_error().to_string()));
        }
        self.live.retain(|(_, expiry)| *expiry > now);
        if self.live.len() >= MAX_TOKENS {
            if let Some(soonest) = (0..self.live.len()).min_by_key(|&i| self.live[i].1) {
                self.live.swap_remove(soonest);
            }
        }
        self.live.push((secret, now + Duration::from_secs(ttl_seconds.into())));
        Ok(secret.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether `token` was issued and has not expired at `now`.
    pub fn is_valid(&self, token: &str, now: Instant) -> bool {
        let Some(secret) = decode(token) else { return false };
        // Every entry compared in full: the answer's timing says nothing about which bytes matched.
        self.live.iter().fold(false, |found, (s, expiry)| {
            let same = s.iter().zip(&secret).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
            found | (same && *expiry > now)
        })
    }
}

fn decode(token: &str) -> Option<[u8; TOKEN_BYTES]> {
    let bytes = token.trim().as_bytes();
    if bytes.len() != TOKEN_BYTES * 2 {
        return None;
    }
    let mut out = [0u8; TOKEN_BYTES];
    for (o, pair) in out.iter_mut().zip(bytes.chunks(2)) {
        *o = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_expire_and_are_bounded() {
        let (mut t, now) = (Tokens::default(), Instant::now());
        let a = t.issue(1, now).unwrap();
        assert_eq!(a.len(), 64);
        assert!(t.is_valid(&a, now));
        assert!(!t.is_valid(&a, now + Duration::from_secs(2)), "expired");
        assert!(!t.is_valid("zz", now) && !t.is_valid(&"0".repeat(64), now));
        assert_eq!(t.issue(0, now), Err(TokenError::Ttl(0)));
        assert_eq!(t.issue(21601, now), Err(TokenError::Ttl(21601)));
        let long = t.issue(100, now).unwrap();
        for _ in 0..MAX_TOKENS + 10 {
            t.issue(50, now).unwrap();
        }
        assert!(t.live.len() <= MAX_TOKENS);
        assert!(t.is_valid(&long, now), "the soonest to expire go first");
    }
}
