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
pub fn refused(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return refused_v4(v4);
            }
            let seg = v6.segments();
            // NAT64 (64:ff9b::/96) carries an IPv4 address.
            if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
                let o = v6.octets();
                return refused_v4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_unspecified() {
                Some("the unspecified address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if seg[0] & 0xffc0 == 0xfe80 {
                Some("a link-local address")
            } else if seg[0] & 0xfe00 == 0xfc00 {
                Some("a private (unique local) address")
            } else if seg[0] & 0xffc0 == 0xfec0 {
                Some("a site-local address")
            } else if seg[0] == 0x2001 && seg[1] == 0x0db8 {
                Some("a documentation address")
            } else if v6 == Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1) {
                Some("a loopback address")
            } else {
                None
            }
        }
    }
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
    for ip in addrs {
        if let Some(why) = refused(ip) {
            return Err(format!(
                "resolves to {ip}, {why}; such targets need webhooks.allow_private = true"
            ));
        }
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
            if !allow
                && let Some((ip, why)) = addrs
                    .iter()
                    .find_map(|a| refused(a.ip()).map(|w| (a.ip(), w)))
            {
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
