//! Which client a request comes from: the TCP peer, or, when the peer is a
//! trusted reverse proxy, the client that proxy reports in
//! `X-Forwarded-For`. The login limit is keyed on this address and the
//! audit records it.
//!
//! - A peer is trusted when its address is in a `--trusted-proxy` range,
//!   or when the request carries the proxy secret of `--proxy-secret-env`.
//!   A header from any other peer is ignored: anybody can write one.
//! - Behind a trusted peer the client is the right-most hop of
//!   `X-Forwarded-For` that is not itself a trusted proxy: each proxy
//!   appends the address it saw, so hops further left are whatever the
//!   client chose to send. A hop that is not an address (a proxy that
//!   writes something else) falls back to the peer.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;

/// One `--trusted-proxy` range: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `10.0.0.0/8`, `2001:db8::/32`, or a single address (`10.1.2.3`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad =
            || format!("{text:?} is not an address range such as 10.0.0.0/8 or 2001:db8::/32");
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None => max,
        };
        if prefix > max {
            return Err(bad());
        }
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` is in the range (an IPv4-mapped IPv6 address counts as
    /// its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                same_prefix(&net.octets(), &ip.octets(), self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                same_prefix(&net.octets(), &ip.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

fn same_prefix(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (whole, rest) = (usize::from(prefix / 8), prefix % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Where a request came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAddr {
    /// The client, as the trusted proxy reported it, or the peer.
    pub client: IpAddr,
    /// The trusted proxy the request came through, if any.
    pub via: Option<IpAddr>,
}

impl ClientAddr {
    /// The request's client: see the module's comment. `peer_trusted` is
    /// true when the peer proved itself the proxy with its secret.
    pub fn of(peer: SocketAddr, headers: &HeaderMap, trusted: &[Cidr], peer_trusted: bool) -> Self {
        let peer = canonical(peer.ip());
        let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
        if !(peer_trusted || is_trusted(peer)) {
            return Self {
                client: peer,
                via: None,
            };
        }
        // Every X-Forwarded-For header, in order, as one list of hops.
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = None;
        for hop in hops.iter().rev() {
            let Ok(ip) = hop.parse::<IpAddr>().map(canonical) else {
                break;
            };
            client = Some(ip);
            if !is_trusted(ip) {
                break;
            }
        }
        match client {
            Some(c) => Self {
                client: c,
                via: Some(peer),
            },
            None => Self {
                client: peer,
                via: None,
            },
        }
    }

    /// The key of the login limit: the client's address, or for IPv6 its
    /// /64 network, which one machine usually holds all of.
    pub fn limit_key(&self) -> String {
        match self.client {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        }
    }
}

impl fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.via {
            Some(via) => write!(f, "{} via {via}", self.client),
            None => write!(f, "{}", self.client),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn from(peer: &str, xff: &[&str], trusted: &[&str], secret: bool) -> String {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        let trusted: Vec<Cidr> = trusted.iter().map(|t| Cidr::parse(t).unwrap()).collect();
        ClientAddr::of(peer.parse().unwrap(), &h, &trusted, secret).to_string()
    }

    #[test]
    fn only_a_trusted_peer_names_the_client() {
        // An untrusted peer's header is ignored.
        assert_eq!(from("1.2.3.4:5", &["9.9.9.9"], &[], false), "1.2.3.4");
        assert_eq!(
            from("1.2.3.4:5", &["9.9.9.9"], &["10.0.0.0/8"], false),
            "1.2.3.4"
        );
        // The right-most hop that is not a trusted proxy.
        let t = ["10.0.0.0/8"];
        assert_eq!(
            from("10.0.0.2:5", &["6.6.6.6, 5.6.7.8"], &t, false),
            "5.6.7.8 via 10.0.0.2"
        );
        assert_eq!(
            from("10.0.0.2:5", &["6.6.6.6", "5.6.7.8, 10.0.0.9"], &t, false),
            "5.6.7.8 via 10.0.0.2"
        );
        // No header, or only proxies: the left-most proxy, or the peer.
        assert_eq!(from("10.0.0.2:5", &[], &t, false), "10.0.0.2");
        assert_eq!(
            from("10.0.0.2:5", &["10.0.0.7"], &t, false),
            "10.0.0.7 via 10.0.0.2"
        );
        // Not an address: the peer.
        assert_eq!(from("10.0.0.2:5", &["evil"], &t, false), "10.0.0.2");
        assert_eq!(
            from("10.0.0.2:5", &["5.6.7.8, unknown"], &t, false),
            "10.0.0.2"
        );
        // The proxy secret makes the peer trusted too.
        assert_eq!(
            from("127.0.0.1:5", &["10.1.2.3"], &[], true),
            "10.1.2.3 via 127.0.0.1"
        );
        // IPv4-mapped IPv6 peers match IPv4 ranges.
        assert_eq!(
            from("[::ffff:10.0.0.2]:5", &["5.6.7.8"], &t, false),
            "5.6.7.8 via 10.0.0.2"
        );
    }

    #[test]
    fn ranges_parse_and_match() {
        let c = Cidr::parse("192.168.4.0/22").unwrap();
        assert!(c.contains("192.168.7.255".parse().unwrap()));
        assert!(!c.contains("192.168.8.0".parse().unwrap()));
        assert!(Cidr::parse("::1").unwrap().contains("::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "10.0.0/8", "x", "::/129", "10.0.0.0/"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        let v6 = ClientAddr {
            client: "2001:db8:1:2:3:4:5:6".parse().unwrap(),
            via: None,
        };
        assert_eq!(v6.limit_key(), "2001:db8:1:2::/64");
    }
}
