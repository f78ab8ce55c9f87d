//! Who a connection comes from, so that the server can bound what one
//! client holds and not only what a listener holds:
//! with limits per listener alone, one client that reconnects as fast as it
//! is evicted can take every place a legitimate client needs.
//!
//! A peer is the unit one party controls and cannot cheaply multiply:
//!
//! - on the Unix socket, the user id of the connecting process, as the
//!   kernel recorded it at `connect(2)` (`SO_PEERCRED`): a process cannot
//!   lie about it, and only users the socket's mode lets in can connect;
//! - on TCP from IPv4, the source address;
//! - on TCP from IPv6, the /64 prefix of the source address: a host (an
//!   ISP's customer, a virtual machine, a container) is routinely given a
//!   whole /64 and may use any of its 2^64 addresses, so counting single
//!   addresses would bound nothing. An IPv4-mapped address
//!   (`::ffff:a.b.c.d`, what a dual-stack listener sees) is the IPv4
//!   address.
//!
//! So clients behind one NAT address, or processes of one user, are one
//! peer: the limits per peer are set well above what one legitimate client
//! needs (see `ServerConfig::max_connections_per_peer`).

use std::net::IpAddr;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;

/// The party a connection is counted against for the limits per peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A process of this user id, on the Unix socket.
    Uid(u32),
    /// This IPv4 address, on TCP.
    V4([u8; 4]),
    /// This /64 prefix of IPv6 addresses (the upper 64 bits), on TCP.
    V6Prefix64(u64),
    /// The peer could not be told (the system call failed): all such
    /// connections are counted as one peer, so failing cannot escape the
    /// limit.
    Unknown,
}

impl Peer {
    /// The peer a TCP connection from `ip` belongs to.
    pub fn of_ip(ip: IpAddr) -> Peer {
        match ip {
            IpAddr::V4(v4) => Peer::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::V4(v4.octets()),
                None => Peer::V6Prefix64((u128::from(v6) >> 64) as u64),
            },
        }
    }

    /// The peer of a connected Unix socket: its client's user id.
    pub fn of_unix(stream: &UnixStream) -> Peer {
        match peer_uid(stream) {
            Ok(uid) => Peer::Uid(uid),
            Err(_) => Peer::Unknown,
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Uid(uid) => write!(f, "uid {uid}"),
            Peer::V4(a) => write!(f, "{}", std::net::Ipv4Addr::from(*a)),
            Peer::V6Prefix64(p) => {
                write!(f, "{}/64", std::net::Ipv6Addr::from(u128::from(*p) << 64))
            }
            Peer::Unknown => write!(f, "unknown peer"),
        }
    }
}

/// The user id of the process at the other end of `stream`, from
/// `SO_PEERCRED` (`UnixStream::peer_cred` is not stable Rust yet).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which is a
    // live, properly aligned ucred, and `len` is its size.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "SO_PEERCRED returned a short answer",
        ));
    }
    Ok(cred.uid)
}

/// The user id of the process at the other end of `stream`, from
/// `getpeereid` on systems without `SO_PEERCRED`.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    let mut uid: libc::uid_t = 0;
    let mut gid: libc::gid_t = 0;
    // SAFETY: getpeereid writes one uid and one gid into live locals.
    let rc = unsafe { libc::getpeereid(stream.as_raw_fd(), &mut uid, &mut gid) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_peer_is_the_connecting_user() {
        let (a, _b) = UnixStream::pair().unwrap();
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        assert_eq!(Peer::of_unix(&a), Peer::Uid(me));
    }

    #[test]
    fn ipv6_addresses_of_one_64_prefix_are_one_peer() {
        let a = Peer::of_ip("2001:db8:1:2::1".parse().unwrap());
        let b = Peer::of_ip("2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap());
        let c = Peer::of_ip("2001:db8:1:3::1".parse().unwrap());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn ipv4_addresses_are_peers_of_their_own_and_mapped_ones_are_the_same() {
        let a = Peer::of_ip("127.0.0.2".parse().unwrap());
        let mapped = Peer::of_ip("::ffff:127.0.0.2".parse().unwrap());
        assert_eq!(a, mapped);
        assert_ne!(a, Peer::of_ip("127.0.0.3".parse().unwrap()));
        assert_eq!(a.to_string(), "127.0.0.2");
    }
}
