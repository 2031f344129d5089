//! Gangs on the agent's side: the address the node's peers reach it at, sent at registration,
//! and the environment a replica gets from its start's [`Rendezvous`] (docs/agent.md, "Gangs:
//! rank, world size and peers").

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use spotplane_core::agent::Rendezvous;

/// The names a replica gets from its rendezvous, with what each holds.
///
/// `LOCAL_RANK`, `NODE_RANK` and `NNODES` are not set: a replica sees only its own devices
/// (its first GPU is `cuda:0` whatever its place on the node), and a torchrun started inside
/// a replica sets `LOCAL_RANK` for its own workers from `--nproc-per-node`, taking the node
/// count and rank from `SPOTPLANE_WORLD_SIZE` and `SPOTPLANE_RANK`.
pub fn env(r: &Rendezvous) -> Vec<(&'static str, String)> {
    vec![
        ("SPOTPLANE_RANK", r.rank.to_string()),
        ("SPOTPLANE_WORLD_SIZE", r.world_size.to_string()),
        ("SPOTPLANE_NODE_RANK", r.node_rank.to_string()),
        ("SPOTPLANE_PEER_ADDRS", r.peers.join(",")),
        ("RANK", r.rank.to_string()),
        ("WORLD_SIZE", r.world_size.to_string()),
        ("MASTER_ADDR", r.master_addr.clone()),
        ("MASTER_PORT", r.master_port.to_string()),
    ]
}

/// `--advertise-address`: an IP address a peer can connect to (not `0.0.0.0`, `::` or a
/// multicast address).
pub fn parse_advertise_address(s: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not an IP address (such as 10.0.3.7 or fd00::7)"))?;
    if ip.is_unspecified() || ip.is_multicast() {
        return Err(format!(
            "{ip} cannot be connected to; give the node's own private address"
        ));
    }
    Ok(ip)
}

/// The node's address on the way to `control_plane` (a URL): the local address of a UDP
/// socket `connect`ed to the control plane's host. Connecting a UDP socket only picks the
/// route and the source address; no packet is sent.
pub async fn local_address_towards(control_plane: &str) -> Result<IpAddr, String> {
    let url = url::Url::parse(control_plane)
        .map_err(|e| format!("the control plane's URL {control_plane:?}: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("the control plane's URL {control_plane:?} names no host"))?;
    // `[fd00::1]` in a URL is `fd00::1` to the resolver.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = url.port_or_known_default().unwrap_or(443);
    let targets: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .collect();
    let mut last = format!("{host} resolves to no address");
    for target in targets {
        match source_address(target) {
            Ok(ip) => return Ok(ip),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn source_address(target: SocketAddr) -> Result<IpAddr, String> {
    let any: IpAddr = match target {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0)).map_err(|e| format!("a UDP socket: {e}"))?;
    socket
        .connect(target)
        .map_err(|e| format!("no route to {target}: {e}"))?;
    let ip = socket
        .local_addr()
        .map_err(|e| format!("the local address towards {target}: {e}"))?
        .ip();
    if ip.is_unspecified() {
        return Err(format!("no local address towards {target}"));
    }
    Ok(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendezvous_becomes_the_names_torch_reads() {
        let r = Rendezvous {
            rank: 2,
            world_size: 4,
            node_rank: 1,
            peers: vec![
                "10.0.0.1".into(),
                "10.0.0.1".into(),
                "10.0.0.2".into(),
                "10.0.0.2".into(),
            ],
            master_addr: "10.0.0.1".into(),
            master_port: 29_731,
        };
        let env: std::collections::BTreeMap<&str, String> = env(&r).into_iter().collect();
        let expected: std::collections::BTreeMap<&str, String> = [
            ("SPOTPLANE_RANK", "2"),
            ("SPOTPLANE_WORLD_SIZE", "4"),
            ("SPOTPLANE_NODE_RANK", "1"),
            (
                "SPOTPLANE_PEER_ADDRS",
                "10.0.0.1,10.0.0.1,10.0.0.2,10.0.0.2",
            ),
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29731"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        assert_eq!(env, expected);
        // Every name the agent sets is one a job may not set itself.
        for (k, _) in super::env(&r) {
            assert!(
                k.starts_with(spotplane_core::job::RESERVED_ENV_PREFIX)
                    || spotplane_core::job::RENDEZVOUS_ENV.contains(&k),
                "{k}"
            );
        }
    }

    #[test]
    fn advertise_addresses_must_be_reachable_ips() {
        for ok in ["10.0.3.7", "127.0.0.2", "fd00::7", " 192.168.1.20 "] {
            assert!(parse_advertise_address(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "node-a",
            "10.0.0.1:29500",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "10.0.0",
        ] {
            assert!(parse_advertise_address(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn the_local_address_is_the_one_towards_the_control_plane() {
        assert_eq!(
            local_address_towards("http://127.0.0.1:8080").await,
            Ok(IpAddr::from(Ipv4Addr::LOCALHOST))
        );
        let ip = local_address_towards("https://localhost")
            .await
            .expect("localhost resolves");
        assert!(ip.is_loopback(), "{ip}");
        assert!(local_address_towards("not a url").await.is_err());
        assert!(local_address_towards("unix:/run/x").await.is_err());
    }
}
