//! IP socket addresses to and from the C `struct sockaddr` that librdmacm takes.

use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A socket address in C form, big enough for IPv4 and IPv6.
pub(crate) struct SockAddr {
    storage: libc::sockaddr_storage,
}

impl SockAddr {
    pub(crate) fn new(addr: SocketAddr) -> SockAddr {
        // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    // The octets are already in network order.
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>().write(sin) };
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { (&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>().write(sin6) };
            }
        }
        SockAddr { storage }
    }

    /// The pointer librdmacm takes; it reads the family to know the length.
    pub(crate) fn as_ffi(&mut self) -> *mut crate::ffi::sockaddr {
        (&mut self.storage as *mut libc::sockaddr_storage).cast()
    }
}

/// Reads an IPv4 or IPv6 address (`None` for another family or an unset address).
///
/// # Safety
/// `sa` must point to at least `size_of::<sockaddr_storage>()` readable bytes, or to a
/// `sockaddr` whose family says how long it is (IPv4, IPv6).
pub(crate) unsafe fn from_ffi(sa: *const crate::ffi::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees the family field is readable.
    let family = i32::from(unsafe { (*sa.cast::<libc::sockaddr>()).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in; read unaligned in case the
            // C storage is packed differently.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, a sockaddr_in6.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_and_ipv6_addresses_round_trip_through_the_c_form() {
        for text in ["10.99.0.1:7471", "0.0.0.0:0", "[fe80::1]:18515", "[::ffff:10.0.0.2]:1"] {
            let addr: SocketAddr = text.parse().unwrap();
            let mut c = SockAddr::new(addr);
            // SAFETY: a full sockaddr_storage.
            assert_eq!(unsafe { from_ffi(c.as_ffi()) }, Some(addr), "{text}");
        }
    }

    #[test]
    fn the_port_is_in_network_order_and_unknown_families_read_as_none() {
        let mut c = SockAddr::new("1.2.3.4:7471".parse().unwrap());
        let raw = c.as_ffi().cast::<libc::sockaddr_in>();
        // SAFETY: SockAddr::new wrote a sockaddr_in there.
        let sin = unsafe { raw.read() };
        assert_eq!(sin.sin_port.to_ne_bytes(), 7471u16.to_be_bytes());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [1, 2, 3, 4]);
        // SAFETY: plain data.
        let mut other: libc::sockaddr_storage = unsafe { mem::zeroed() };
        other.ss_family = libc::AF_UNIX as libc::sa_family_t;
        // SAFETY: a full sockaddr_storage.
        assert_eq!(unsafe { from_ffi((&other as *const libc::sockaddr_storage).cast()) }, None);
    }
}
