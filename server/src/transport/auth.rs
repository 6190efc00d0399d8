//! The shared token of the HTTP API and the RPCs, compared in constant time.

/// The gRPC metadata key of the cluster token on the node RPCs and `Api.Forward`
/// (agents and servers among themselves; lowercase, as gRPC metadata keys must be).
/// Users' HTTP requests carry theirs in `X-Nomad-Token` instead.
pub use drover_server_api::RPC_TOKEN_KEY;

/// Equal bytes, in time that depends only on the lengths: a wrong token's answer must
/// not tell how much of it was right. (The length is not secret enough to hide: it is
/// the token file's; the bytes are.)
pub fn token_eq(given: &[u8], want: &[u8]) -> bool {
    if given.len() != want.len() {
        return false;
    }
    let diff = given
        .iter()
        .zip(want)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::token_eq;

    #[test]
    fn tokens_compare_whole() {
        assert!(token_eq(b"secret", b"secret"));
        assert!(!token_eq(b"secret", b"secreT"));
        assert!(!token_eq(b"secreT", b"secret"));
        assert!(!token_eq(b"secret", b"secret2"));
        assert!(!token_eq(b"secret1", b"secret"));
        assert!(!token_eq(b"", b"x"));
        assert!(!token_eq(b"", b"secret"));
    }
}
