//! UD multicast: a UD QP attached to a multicast group receives the datagrams sent to it
//! (`ibv_attach_mcast` / `ibv_detach_mcast`).

use std::fmt;
use std::sync::Arc;

use super::{QpInner, QueuePair};
use crate::codes::QpType;
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::port::Gid;

/// The QP number a datagram to a multicast group is sent to (`0xFFFFFF`): every QP
/// attached to the group on the receiving ports gets a copy.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// True for a GID the kernel takes for a multicast group (as `rdma_is_multicast_addr`):
/// an IPv6 multicast address (`ff00::/8`), or on RoCE v2 over IPv4 an IPv4-mapped
/// multicast address (`::ffff:224.0.0.0/100`, what rdma_cm joins for an IPv4 group).
pub(crate) fn is_multicast_gid(gid: Gid) -> bool {
    gid.0[0] == 0xff || gid.ipv4().is_some_and(|ip| ip.is_multicast())
}

impl QueuePair {
    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`); on RoCE it
    /// makes no IP-level join: the host must join the IP group too (a socket's
    /// `join_multicast_v4`/`v6`), or use [`CmId::join_multicast`](crate::CmId::join_multicast),
    /// which does both.
    ///
    /// From then on the QP receives the datagrams sent to the group, through its receive
    /// queue, as any datagram (with a GRH, and the sender's QP number as the source). The
    /// group is left when the returned [`MulticastMembership`] is dropped or
    /// [`detach`](MulticastMembership::detach)ed; it keeps the QP alive until then.
    ///
    /// Why the IP join: on RoCE v2 the device sends a datagram to the group as IP multicast
    /// on its netdev. rxe's own datagrams reach this host's members only while a socket here
    /// is a member of that IP group (the kernel's loopback of multicast), and across hosts
    /// the switches deliver the group only to ports that joined it (IGMP or MLD snooping).
    /// examples/multicast.rs does it with a `std::net::UdpSocket`, kept open while the QP
    /// is attached. InfiniBand instead needs the subnet manager's join (rdma_cm makes it).
    ///
    /// `lid` is the group's multicast LID on InfiniBand (`0xC000..=0xFFFE`, from the
    /// subnet manager); RoCE ignores it (pass 0). On RoCE v2 over IPv4 the group is an
    /// IPv4-mapped multicast address (`::ffff:239.1.2.3`), on IPv6 an `ff..` address. To
    /// send to the group: an [`AddressHandle`](crate::AddressHandle) to `gid`, remote QP
    /// [`MULTICAST_QPN`], and the group's Q_Key (which every member's QP must have).
    ///
    /// Refused before any C call, with [`Error::InvalidArgument`] naming
    /// [`Verb::QpAttachMulticast`]: a QP that is not UD (only UD QPs join groups), and a
    /// `gid` that is not a multicast address. A device without multicast
    /// (`max_mcast_grp` 0, as siw) is refused first, with [`Error::NotSupported`] naming
    /// the same verb and `max_mcast_grp`.
    #[doc(alias = "ibv_attach_mcast")]
    pub fn attach_multicast(&self, gid: Gid, lid: u16) -> Result<MulticastMembership> {
        const OURS: Verb = Verb::QpAttachMulticast;
        if self.context().query_device()?.raw.max_mcast_grp <= 0 {
            return Err(Error::not_supported(OURS, "multicast: the device's max_mcast_grp is 0 (ibv_query_device)"));
        }
        if self.qp_type() != QpType::Ud {
            return Err(Error::invalid(
                OURS,
                format!("QP {:#x} is {}: only UD QPs join multicast groups", self.qp_num(), self.qp_type()),
            ));
        }
        if !is_multicast_gid(gid) {
            return Err(Error::invalid(
                OURS,
                format!(
                    "{gid} is not a multicast GID: a group is an IPv6 multicast address (ff00::/8) or, \
                     on RoCE v2 over IPv4, an IPv4-mapped one (::ffff:224.0.0.0 to ::ffff:239.255.255.255)"
                ),
            ));
        }
        let raw = gid.to_ffi();
        // SAFETY: the QP is live (self) and `raw` is a GID the call only reads.
        let rc = unsafe { ffi::ibv_attach_mcast(self.as_raw(), &raw, lid) };
        conv::rc(Verb::AttachMcast, rc)?;
        Ok(MulticastMembership { qp: Arc::clone(&self.inner), gid, lid, attached: true })
    }
}

/// A UD QP's membership of a multicast group, from [`QueuePair::attach_multicast`]:
/// the QP leaves the group when this is dropped (an error then is logged) or
/// [`detach`](Self::detach)ed (which reports it).
#[must_use = "dropping the membership detaches the QP from the group at once"]
pub struct MulticastMembership {
    qp: Arc<QpInner>,
    gid: Gid,
    lid: u16,
    attached: bool,
}

impl MulticastMembership {
    /// The group's GID.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The group's LID as it was attached with.
    pub fn lid(&self) -> u16 {
        self.lid
    }

    /// The number of the QP that is a member.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live while this membership holds it.
        unsafe { (*self.qp.raw.as_ptr()).qp_num }
    }

    /// Leaves the group now and reports the result (`ibv_detach_mcast`). Datagrams sent
    /// to the group after it returns are not delivered to this QP.
    #[doc(alias = "ibv_detach_mcast")]
    pub fn detach(mut self) -> Result<()> {
        self.attached = false;
        self.detach_now()
    }

    fn detach_now(&self) -> Result<()> {
        let raw = self.gid.to_ffi();
        // SAFETY: the QP is live (held by `self.qp`), attached to this group, and `raw` is
        // a GID the call only reads.
        let rc = unsafe { ffi::ibv_detach_mcast(self.qp.raw.as_ptr(), &raw, self.lid) };
        conv::rc(Verb::DetachMcast, rc)
    }
}

impl Drop for MulticastMembership {
    fn drop(&mut self) {
        if self.attached {
            if let Err(e) = self.detach_now() {
                log::error!("{e}");
            }
        }
    }
}

impl fmt::Debug for MulticastMembership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MulticastMembership")
            .field("qp_num", &self.qp_num())
            .field("gid", &self.gid)
            .field("lid", &self.lid)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(s: &str) -> Gid {
        Gid(s.parse::<std::net::Ipv6Addr>().unwrap().octets())
    }

    #[test]
    fn multicast_gids_are_ff_addresses_and_ipv4_mapped_class_d_addresses_as_the_kernel_takes_them() {
        for g in ["ff0e::1", "ff02::1:ff00:1", "::ffff:239.1.2.3", "::ffff:224.0.0.1"] {
            assert!(is_multicast_gid(gid(g)), "{g}");
        }
        for g in ["fe80::1", "::ffff:10.99.0.1", "::ffff:240.0.0.1", "::", "::1", "0fff::1"] {
            assert!(!is_multicast_gid(gid(g)), "{g}");
        }
    }
}
