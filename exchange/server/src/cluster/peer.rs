//! What the writer believes of a forwarded request: the client address a forwarding node names,
//! when the request proves it came from a node with the epoch's token.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName};

/// The client's address, as the forwarding node saw it.
pub const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-cx-forwarded-for");

/// The writer epoch's forwarding token ([`crate::books::Lease::forward_token`]).
pub const FORWARD_TOKEN: HeaderName = HeaderName::from_static("x-cx-forward-token");

/// The address a request's limits count: the one [`FORWARDED_FOR`] names when the request
/// carries `token` (the writer's own, `None` when it takes no forwarded requests), else the
/// connection's peer. A client naming an address of its own without the token is counted as
/// itself.
pub fn client_ip(headers: &HeaderMap, peer: Option<IpAddr>, token: Option<&str>) -> Option<IpAddr> {
    let forwarded = token
        .filter(|token| {
            headers
                .get(&FORWARD_TOKEN)
                .is_some_and(|sent| same_secret(sent.as_bytes(), token.as_bytes()))
        })
        .and_then(|_| headers.get(&FORWARDED_FOR)?.to_str().ok()?.parse().ok());
    forwarded.or(peer)
}

/// Equality whose time does not depend on where the inputs first differ (a token is guessed
/// byte by byte otherwise).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(token: &str, ip: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(FORWARD_TOKEN, HeaderValue::from_str(token).unwrap());
        h.insert(FORWARDED_FOR, HeaderValue::from_str(ip).unwrap());
        h
    }

    #[test]
    fn a_forwarded_address_counts_only_with_the_token() {
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let client: IpAddr = "203.0.113.7".parse().unwrap();
        let h = headers("secret", "203.0.113.7");
        assert_eq!(client_ip(&h, Some(peer), Some("secret")), Some(client));
        assert_eq!(client_ip(&h, Some(peer), Some("other!")), Some(peer));
        assert_eq!(client_ip(&h, Some(peer), None), Some(peer));
        assert_eq!(
            client_ip(&HeaderMap::new(), Some(peer), Some("secret")),
            Some(peer)
        );
        let garbled = headers("secret", "not an address");
        assert_eq!(client_ip(&garbled, Some(peer), Some("secret")), Some(peer));
    }
}
