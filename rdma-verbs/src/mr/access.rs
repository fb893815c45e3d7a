//! What a region grants: access flags, and the two kinds of region (local, and writable by
//! peers) as types.

use super::*;
use crate::error::{Error, Result, Verb};
use crate::ffi;

bitflags::bitflags! {
    /// What the device and the peers may do with a memory region (`enum ibv_access_flags`).
    /// The default is [`LOCAL_WRITE`](AccessFlags::LOCAL_WRITE): local use only. Bits this
    /// crate does not name are kept.
    #[doc(alias = "ibv_access_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local device may write the memory (receives, RDMA READ results, atomics).
        const LOCAL_WRITE = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        /// Peers may write the memory with RDMA WRITE. Needs `LOCAL_WRITE` (added for you).
        const REMOTE_WRITE = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        /// Peers may read the memory with RDMA READ.
        const REMOTE_READ = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        /// Peers may run atomics (fetch-and-add, compare-and-swap) on the memory. Needs
        /// `LOCAL_WRITE` (added for you).
        const REMOTE_ATOMIC = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
        /// Memory windows may be bound to the region (and may grant remote write).
        const MW_BIND = ffi::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        /// Remote addresses count from the start of the region instead of being virtual
        /// addresses (used with memory windows).
        const ZERO_BASED = ffi::ibv_access_flags::IBV_ACCESS_ZERO_BASED.0;
        /// On-demand paging: the pages are not pinned. Checked against the device's
        /// `odp_caps` before C (see
        /// [`ProtectionDomain::register_on_demand`](crate::ProtectionDomain::register_on_demand)).
        const ON_DEMAND = ffi::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;
        /// The memory is backed by huge pages (a hint).
        const HUGETLB = ffi::ibv_access_flags::IBV_ACCESS_HUGETLB.0;
        /// The device may reorder its PCIe writes to the memory, for bandwidth on hosts
        /// where strict ordering costs. A hint: one of the optional access flags, which a
        /// device or kernel that does not know it ignores (registration does not fail for
        /// it); it grants peers nothing, so `Local` regions may carry it.
        const RELAXED_ORDERING = ffi::ibv_access_flags::IBV_ACCESS_RELAXED_ORDERING.0;
        // Keep bits from newer rdma-core releases.
        const _ = !0;
    }
}

impl Default for AccessFlags {
    /// Local use only: [`AccessFlags::LOCAL_WRITE`].
    fn default() -> Self {
        AccessFlags::LOCAL_WRITE
    }
}

impl AccessFlags {
    /// Every bit this crate names.
    const KNOWN: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC)
        .union(AccessFlags::MW_BIND)
        .union(AccessFlags::ZERO_BASED)
        .union(AccessFlags::ON_DEMAND)
        .union(AccessFlags::HUGETLB)
        .union(AccessFlags::RELAXED_ORDERING);

    /// Flags that let a peer change the memory without any action of this process.
    const REMOTE_WRITERS: AccessFlags =
        AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_ATOMIC).union(AccessFlags::MW_BIND);

    /// Flags that let a peer reach the memory with the region's own rkey.
    const REMOTE_RIGHTS: AccessFlags =
        AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE).union(AccessFlags::REMOTE_ATOMIC);

    /// True when a peer may write the memory (or may be allowed to, through a window or a
    /// bit this crate does not know).
    pub fn is_remote_writable(self) -> bool {
        self.intersects(Self::REMOTE_WRITERS) || !self.difference(Self::KNOWN).is_empty()
    }

    /// True when the region's rkey lets a peer reach the memory at all: `REMOTE_READ`,
    /// `REMOTE_WRITE`, `REMOTE_ATOMIC`, or a bit this crate does not know (which might).
    /// `MW_BIND` alone does not: peers then use the rkey of a window bound to the region.
    pub fn is_remote_accessible(self) -> bool {
        self.intersects(Self::REMOTE_RIGHTS) || !self.difference(Self::KNOWN).is_empty()
    }
}

/// The descriptor of `addr..addr + len` under `rkey`, or an error (naming `verb`) when
/// `access` gives peers no right that an rkey could carry: such a descriptor could never
/// work, every request through it would fail at the peer with a remote access error.
pub(crate) fn remote_descriptor(verb: Verb, addr: u64, len: u64, rkey: u32, access: AccessFlags) -> Result<RemoteMr> {
    if !access.is_remote_accessible() {
        return Err(Error::invalid(
            verb,
            format!(
                "the region was registered with {access:?}, which lets no peer reach it: a remote \
                 descriptor of it would be refused on every request. Register it with REMOTE_READ \
                 (`register`), or REMOTE_WRITE / REMOTE_ATOMIC (`register_remote_writable`)"
            ),
        ));
    }
    Ok(RemoteMr { addr, len, rkey })
}

mod sealed {
    pub trait Sealed {}
}

/// Whether a region's memory may be written by peers: [`Local`] or [`RemoteWritable`].
/// Chosen when registering; it decides which views of the bytes the region offers.
pub trait AccessMode: sealed::Sealed + 'static {
    /// True for [`RemoteWritable`].
    const REMOTE_WRITABLE: bool;
}

/// Marker: no peer may write the region (`LOCAL_WRITE`, `REMOTE_READ`, ...). The region
/// gives plain slices.
#[derive(Debug)]
pub enum Local {}

/// Marker: peers may write the region (`REMOTE_WRITE`, `REMOTE_ATOMIC`, `MW_BIND`). The
/// region gives volatile copies and atomic words, never plain slices.
#[derive(Debug)]
pub enum RemoteWritable {}

impl sealed::Sealed for Local {}
impl sealed::Sealed for RemoteWritable {}
impl AccessMode for Local {
    const REMOTE_WRITABLE: bool = false;
}
impl AccessMode for RemoteWritable {
    const REMOTE_WRITABLE: bool = true;
}

/// The flags to register with for mode `A`: checked, with `LOCAL_WRITE` added where the
/// verbs require it.
pub(super) fn effective_access<A: AccessMode>(access: AccessFlags) -> Result<AccessFlags> {
    if !A::REMOTE_WRITABLE && access.is_remote_writable() {
        let mut names: Vec<String> =
            access.intersection(AccessFlags::REMOTE_WRITERS).iter_names().map(|(n, _)| n.to_owned()).collect();
        let unknown = access.difference(AccessFlags::KNOWN);
        if !unknown.is_empty() {
            names.push(format!("unknown bits {:#x}", unknown.bits()));
        }
        return Err(Error::invalid(
            Verb::RegMr,
            format!(
                "{} would let peers write this memory at any time, which plain Rust slices cannot allow: \
                 register it with `register_remote_writable` (volatile and atomic access instead of slices)",
                names.join(" | ")
            ),
        ));
    }
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
        return Ok(access | AccessFlags::LOCAL_WRITE);
    }
    Ok(access)
}
