//! Which URLs webhooks may be sent to.
//!
//! The control plane sits inside a network; a webhook URL must not turn it into a way to reach
//! internal services. A target is `http` or `https`, carries no credentials, and its host —
//! resolved, every address of it — is not private, loopback, link-local, unspecified,
//! multicast or otherwise reserved, unless the admin allows private targets
//! (`webhooks.allow_private = true`). The check is made when a subscription is created and
//! again when each attempt connects ([`GuardedResolver`] resolves the name and refuses such
//! addresses), so a name that later resolves elsewhere (DNS rebinding) gains nothing.
//! Redirects are not followed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::{Host, Url};

/// Why an address may not be called, if it may not.
///
/// An IPv6 address that carries an IPv4 address is judged by that IPv4 address too, in every
/// form that carries one: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-translated
/// (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`), 6to4
/// (`2002:AABB:CCDD::`), Teredo (server in bits 32..64, client inverted in the last 32) and
/// ISATAP (an interface id of `0:5efe:a.b.c.d` or `200:5efe:a.b.c.d`, under any prefix). Past
/// those, only global unicast (`2000::/3`) outside the documentation and other special ranges
/// may be called: anything else is reserved, local, or a translator into a local network.
pub fn refused(ip: IpAddr) -> Option<String> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4).map(str::to_owned),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

/// A way an IPv6 address carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// `::ffff:a.b.c.d`: the IPv4 address itself, as a dual-stack socket sees it.
    Mapped,
    /// `::ffff:0:a.b.c.d` (SIIT, RFC 2765).
    Translated,
    /// `::a.b.c.d` (deprecated, RFC 4291).
    Compatible,
    /// `64:ff9b::a.b.c.d`, the NAT64 well-known prefix (RFC 6052).
    Nat64,
    /// `2002:AABB:CCDD::/48`, 6to4 (RFC 3056): the IPv4 address in bits 16..48.
    SixToFour,
    /// `2001:0:AABB:CCDD::`, Teredo (RFC 4380): the server in bits 32..64.
    TeredoServer,
    /// Teredo's client, the last 32 bits inverted.
    TeredoClient,
    /// An interface id of `0:5efe:a.b.c.d` or `200:5efe:a.b.c.d` (ISATAP, RFC 5214).
    Isatap,
}

impl Embedding {
    pub fn as_str(self) -> &'static str {
        match self {
            Embedding::Mapped => "an IPv4-mapped address",
            Embedding::Translated => "an IPv4-translated address",
            Embedding::Compatible => "an IPv4-compatible address",
            Embedding::Nat64 => "a NAT64 address",
            Embedding::SixToFour => "a 6to4 address",
            Embedding::TeredoServer => "a Teredo address (its server)",
            Embedding::TeredoClient => "a Teredo address (its client)",
            Embedding::Isatap => "an ISATAP address",
        }
    }

    /// Whether a connection to the IPv6 address goes to the IPv4 address (through the
    /// host's own stack or a translator), so a public IPv4 address makes it callable.
    fn reaches_v4(self) -> bool {
        matches!(
            self,
            Embedding::Mapped | Embedding::Translated | Embedding::Nat64
        )
    }
}

/// The IPv4 addresses an IPv6 address carries, each with its form.
pub fn embedded_v4(ip: Ipv6Addr) -> Vec<(Embedding, Ipv4Addr)> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    let mut out = Vec::new();
    if s[..5] == [0; 5] && s[5] == 0xffff {
        out.push((Embedding::Mapped, v4(s[6], s[7])));
    } else if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
        out.push((Embedding::Translated, v4(s[6], s[7])));
    } else if s[..6] == [0; 6] {
        out.push((Embedding::Compatible, v4(s[6], s[7])));
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4] {
        out.push((Embedding::Nat64, v4(s[6], s[7])));
    } else if s[0] == 0x2002 {
        out.push((Embedding::SixToFour, v4(s[1], s[2])));
    } else if s[0] == 0x2001 && s[1] == 0 {
        out.push((Embedding::TeredoServer, v4(s[2], s[3])));
        out.push((Embedding::TeredoClient, v4(!s[6], !s[7])));
    }
    // ISATAP's interface id can follow any prefix (its u/l bit set or not).
    if (s[4] == 0 || s[4] == 0x0200) && s[5] == 0x5efe {
        out.push((Embedding::Isatap, v4(s[6], s[7])));
    }
    out
}

fn refused_v6(v6: Ipv6Addr) -> Option<String> {
    let seg = v6.segments();
    if v6.is_loopback() {
        return Some("a loopback address".into());
    }
    if v6.is_unspecified() {
        return Some("the unspecified address".into());
    }
    let embedded = embedded_v4(v6);
    for (form, v4) in &embedded {
        if let Some(why) = refused_v4(*v4) {
            return Some(format!("{} carrying {v4}, {why}", form.as_str()));
        }
    }
    if embedded.first().is_some_and(|(form, _)| form.reaches_v4()) {
        return None;
    }
    let why = if v6.is_multicast() {
        "a multicast address"
    } else if seg[0] & 0xffc0 == 0xfe80 {
        "a link-local address"
    } else if seg[0] & 0xfe00 == 0xfc00 {
        "a private (unique local) address"
    } else if seg[0] & 0xffc0 == 0xfec0 {
        "a site-local address"
    } else if seg[0] == 0x64 && seg[1] == 0xff9b {
        "a local-use NAT64 address (a translator into a local network)"
    } else if seg[0] & 0xe000 != 0x2000 {
        "not a global unicast address (outside 2000::/3)"
    } else if (seg[0] == 0x2001 && seg[1] == 0x0db8) || seg[0] & 0xfff0 == 0x3ff0 {
        "a documentation address"
    } else if seg[0] == 0x2001 && seg[1] == 0x0002 && seg[2] == 0 {
        "a benchmarking address"
    } else if seg[0] == 0x2001 && (seg[1] & 0xffe0 == 0x0020 || seg[1] & 0xfff0 == 0x0010) {
        "an ORCHID address"
    } else {
        return None;
    };
    Some(why.into())
}

/// The first address of a host that may not be called, and why: the one check both a URL's
/// literal host and every address a name resolves to go through.
pub fn first_refused(addrs: impl IntoIterator<Item = IpAddr>) -> Option<(IpAddr, String)> {
    addrs
        .into_iter()
        .find_map(|ip| refused(ip).map(|why| (ip, why)))
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_private() {
        Some("a private address")
    } else if ip.is_link_local() {
        Some("a link-local address (cloud metadata services live there)")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("the unspecified network")
    } else if ip.is_broadcast() || ip.is_multicast() || o[0] >= 240 {
        Some("a broadcast, multicast or reserved address")
    } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
        Some("a shared (carrier-grade NAT) address")
    } else if ip.is_documentation() || (o[0] == 198 && (o[1] & 0xfe) == 18) {
        Some("a documentation or benchmarking address")
    } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
        Some("an IETF protocol assignment address")
    } else {
        None
    }
}

/// Checks a URL's form: scheme, credentials, host. Does not resolve.
pub fn parse(url: &str) -> Result<Url, String> {
    let u = Url::parse(url.trim()).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(format!("must be http or https, not {}", u.scheme()));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(
            "must not carry credentials (user:password@); authenticate by the signature".into(),
        );
    }
    if u.host().is_none() {
        return Err("has no host".into());
    }
    if url.len() > 2048 {
        return Err("is longer than 2048 characters".into());
    }
    Ok(u)
}

/// Checks a URL fully: its form and, unless private targets are allowed, every address its
/// host resolves to.
pub async fn check(url: &str, allow_private: bool) -> Result<Url, String> {
    let u = parse(url)?;
    if allow_private {
        return Ok(u);
    }
    let port = u.port_or_known_default().unwrap_or(443);
    let addrs: Vec<IpAddr> = match u.host() {
        Some(Host::Ipv4(ip)) => vec![IpAddr::V4(ip)],
        Some(Host::Ipv6(ip)) => vec![IpAddr::V6(ip)],
        Some(Host::Domain(d)) => resolve(d, port)
            .await?
            .into_iter()
            .map(|a| a.ip())
            .collect(),
        None => return Err("has no host".into()),
    };
    if let Some((ip, why)) = first_refused(addrs) {
        return Err(format!(
            "resolves to {ip}, {why}; such targets need webhooks.allow_private = true"
        ));
    }
    Ok(u)
}

async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let lookup = tokio::net::lookup_host((host, port));
    match tokio::time::timeout(Duration::from_secs(5), lookup).await {
        Ok(Ok(addrs)) => {
            let v: Vec<SocketAddr> = addrs.collect();
            if v.is_empty() {
                Err(format!("{host} resolves to no address"))
            } else {
                Ok(v)
            }
        }
        Ok(Err(e)) => Err(format!("{host} does not resolve: {e}")),
        Err(_) => Err(format!("resolving {host} timed out")),
    }
}

/// The resolver of the webhook HTTP client: resolves with the system, and refuses a name any
/// of whose addresses may not be called (unless private targets are allowed).
#[derive(Debug, Clone, Copy)]
pub struct GuardedResolver {
    pub allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = resolve(&host, 0)
                .await
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })?;
            if !allow && let Some((ip, why)) = first_refused(addrs.iter().map(SocketAddr::ip)) {
                return Err(format!("{host} resolves to {ip}, {why}").into());
            }
            let it: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(it)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_refused_and_public_ones_pass() {
        let refused_ips = [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
        ];
        for ip in refused_ips {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(refused(ip).is_some(), "{ip} must be refused");
        }
        for ip in ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "172.32.0.1"] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(refused(ip), None, "{ip} is public");
        }
    }

    /// Every IPv6 form that carries an IPv4 address is judged by that address: refused when
    /// it carries a loopback, private, link-local or otherwise internal one, in each form.
    #[test]
    fn ipv6_addresses_carrying_internal_ipv4_addresses_are_refused_in_every_form() {
        // (address, what it carries, refused)
        let table = [
            // IPv4-mapped
            ("::ffff:127.0.0.1", "127.0.0.1", true),
            ("::ffff:10.0.0.1", "10.0.0.1", true),
            ("::ffff:8.8.8.8", "8.8.8.8", false),
            // IPv4-translated (SIIT)
            ("::ffff:0:192.168.1.1", "192.168.1.1", true),
            ("::ffff:0:8.8.8.8", "8.8.8.8", false),
            // IPv4-compatible (deprecated; not global unicast either way)
            ("::127.0.0.1", "127.0.0.1", true),
            ("::169.254.169.254", "169.254.169.254", true),
            // 6to4: the IPv4 address in bits 16..48
            ("2002:7f00:1::", "127.0.0.1", true),
            ("2002:a9fe:a9fe::1", "169.254.169.254", true),
            ("2002:c0a8:101:1::1", "192.168.1.1", true),
            ("2002:6440:1::", "100.64.0.1", true),
            ("2002:808:808::1", "8.8.8.8", false),
            // NAT64, the well-known prefix
            ("64:ff9b::7f00:1", "127.0.0.1", true),
            ("64:ff9b::a00:1", "10.0.0.1", true),
            ("64:ff9b::808:808", "8.8.8.8", false),
            // NAT64, the local-use prefix: a translator into a local network, whatever it carries
            ("64:ff9b:1::808:808", "", true),
            ("64:ff9b:1:7f00:1::", "", true),
            // Teredo: the server in bits 32..64, the client inverted in the last 32
            ("2001:0:a00:1::f7f7:f7f7", "10.0.0.1", true),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1", true),
            ("2001:0:4136:e378:8000:63bf:3f57:fefe", "192.168.1.1", true),
            ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", "8.8.8.8", false),
            // ISATAP, under a global prefix, with the u/l bit clear and set
            ("2001:4860:0:1:0:5efe:7f00:1", "127.0.0.1", true),
            ("2001:4860:0:1:200:5efe:a9fe:a9fe", "169.254.169.254", true),
            ("2001:4860:0:1:200:5efe:808:808", "8.8.8.8", false),
        ];
        for (ip, carried, want) in table {
            let v6: Ipv6Addr = ip.parse().expect("ip");
            let got = refused(IpAddr::V6(v6));
            assert_eq!(got.is_some(), want, "{ip}: {got:?}");
            if !carried.is_empty() {
                let v4: Ipv4Addr = carried.parse().expect("ipv4");
                assert!(
                    embedded_v4(v6).iter().any(|(_, e)| *e == v4),
                    "{ip} carries {v4}: {:?}",
                    embedded_v4(v6)
                );
                if want {
                    let why = got.unwrap_or_default();
                    assert!(why.contains(carried), "{ip}: {why}");
                }
            }
        }
        // Past the embedded forms, only global unicast outside the special ranges passes.
        for ip in [
            "100::1",
            "3fff::1",
            "2001:db8::1",
            "2001:2::1",
            "2001:20::1",
            "5f00::1",
            "ff02::1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(refused(ip).is_some(), "{ip} must be refused");
        }
    }

    /// A URL's literal host and the addresses a name resolves to meet the same check.
    #[tokio::test]
    async fn literal_hosts_and_resolved_addresses_go_through_the_same_check() {
        for url in [
            "http://[2002:7f00:1::]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:0:a00:1]/",
            "http://[::7f00:1]/",
            "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
            "http://[64:ff9b:1::a00:1]/",
            "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:8080/",
            "http://[2001:4860:0:1:0:5efe:a00:1]/",
            // IPv4 spelled as the URL standard allows: still 127.0.0.1.
            "http://2130706433/",
            "http://0x7f.1/",
        ] {
            let err = check(url, false).await.expect_err(url);
            assert!(err.contains("allow_private"), "{url}: {err}");
            let u = parse(url).expect("well-formed");
            let literal = match u.host() {
                Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
                Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
                other => panic!("{url}: not a literal: {other:?}"),
            };
            // A name resolving to a public address and this one is refused for this one,
            // with the reason the literal got.
            let public: IpAddr = "2606:4700:4700::1111".parse().expect("ip");
            let (ip, why) = first_refused([public, literal]).expect(url);
            assert_eq!(ip, literal);
            assert!(err.contains(&why), "{url}: {err} vs {why}");
        }
        for url in ["http://[2002:808:808::1]/", "http://[64:ff9b::808:808]/"] {
            assert!(check(url, false).await.is_ok(), "{url} is public");
        }
    }

    #[test]
    fn urls_must_be_http_without_credentials() {
        assert!(parse("https://hooks.example.com/x").is_ok());
        assert!(parse("http://hooks.example.com:8080/x?y=1").is_ok());
        for bad in [
            "ftp://hooks.example.com/",
            "https://user:pw@hooks.example.com/",
            "https://user@hooks.example.com/",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn loopback_names_and_literals_are_refused_unless_allowed() {
        for url in [
            "http://127.0.0.1:9/x",
            "http://[::1]:9/x",
            "http://localhost:9/x",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
        ] {
            let err = check(url, false).await.expect_err(url);
            assert!(err.contains("allow_private"), "{url}: {err}");
            assert!(check(url, true).await.is_ok(), "{url} allowed by config");
        }
    }
}
