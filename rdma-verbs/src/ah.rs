//! Address handles (`struct ibv_ah`): where a UD send goes. The addressing types here
//! ([`Remote`], [`AhAttr`]) also describe the path a connected QP takes at RTR.

use std::fmt;
use std::ptr;
use std::sync::Arc;

use crate::context::Context;
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::pd::ProtectionDomain;
use crate::port::{Gid, PortAttr};
use crate::wc::{WcFlags, WorkCompletion};

/// Bytes of the global route header that a UD receive buffer starts with (`struct ibv_grh`).
pub const GRH_LEN: usize = std::mem::size_of::<ffi::ibv_grh>();

/// The hop limit [`Remote::gid`] sets: the IP TTL of RoCE v2 packets, enough for any
/// routed data-centre fabric.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// How to reach the remote side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// By GID, with a global route header: always on RoCE (the GID is an IP address),
    /// and on InfiniBand across subnets.
    Gid {
        /// The remote GID.
        gid: Gid,
        /// The index of the local GID to send from (on RoCE it picks the source IP address
        /// and the RoCE version; [`Context::default_gid`] chooses a good one): a
        /// [`GidEntry::index`](crate::GidEntry::index). The C field has 8 bits, so an
        /// index above 255 is refused before any C call.
        sgid_index: u32,
        /// Hop limit (the IP TTL on RoCE v2).
        hop_limit: u8,
        /// Traffic class (the IP DSCP and ECN bits on RoCE v2).
        traffic_class: u8,
        /// Flow label, 20 bits.
        flow_label: u32,
    },
    /// By LID: InfiniBand within one subnet.
    Lid {
        /// The remote port's LID (or the multicast LID).
        dlid: u16,
        /// Low bits of the source LID, for ports with an LMC.
        src_path_bits: u8,
    },
}

impl Remote {
    /// A GID route with hop limit [`DEFAULT_HOP_LIMIT`], traffic class 0, flow label 0.
    pub fn gid(gid: Gid, sgid_index: u32) -> Remote {
        Remote::Gid { gid, sgid_index, hop_limit: DEFAULT_HOP_LIMIT, traffic_class: 0, flow_label: 0 }
    }

    /// A LID route (InfiniBand).
    pub fn lid(dlid: u16) -> Remote {
        Remote::Lid { dlid, src_path_bits: 0 }
    }
}

/// An address vector: a local port and the way to the remote side (`struct ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AhAttr {
    /// The local port, from 1.
    pub port: u8,
    /// Where to.
    pub remote: Remote,
    /// Service level (0..=15): the priority on InfiniBand, the VLAN priority on RoCE.
    pub sl: u8,
    /// Static rate limit code (`enum ibv_rate`); 0 means the port's full rate.
    pub static_rate: u8,
}

impl AhAttr {
    /// An address on `port` with service level 0 and no rate limit.
    pub fn new(port: u8, remote: Remote) -> AhAttr {
        AhAttr { port, remote, sl: 0, static_rate: 0 }
    }

    /// An address by GID: fills the global route header from the remote GID and the index
    /// of the local GID to send from (a [`GidEntry::index`](crate::GidEntry::index), as
    /// [`Context::default_gid`] returns it), with the defaults of [`Remote::gid`].
    pub fn global(port: u8, dgid: Gid, sgid_index: u32) -> AhAttr {
        AhAttr::new(port, Remote::gid(dgid, sgid_index))
    }

    /// The C struct. Fails when `sgid_index` does not fit the 8 bits of
    /// `ibv_global_route.sgid_index`.
    pub fn to_ffi(&self) -> Result<ffi::ibv_ah_attr> {
        self.raw(Verb::AhAttrToFfi)
    }

    /// The C struct, or an error naming `verb` when the source GID index does not fit.
    pub(crate) fn raw(&self, verb: Verb) -> Result<ffi::ibv_ah_attr> {
        let mut a =
            ffi::ibv_ah_attr { port_num: self.port, sl: self.sl, static_rate: self.static_rate, ..Default::default() };
        match self.remote {
            Remote::Gid { gid, sgid_index, hop_limit, traffic_class, flow_label } => {
                a.is_global = 1;
                let sgid_index = sgid_index_u8(sgid_index, verb)?;
                a.grh = ffi::ibv_global_route { dgid: gid.to_ffi(), flow_label, sgid_index, hop_limit, traffic_class };
            }
            Remote::Lid { dlid, src_path_bits } => {
                a.dlid = dlid;
                a.src_path_bits = src_path_bits;
            }
        }
        Ok(a)
    }

    /// From the C struct (as `ibv_query_qp` returns it).
    pub fn from_ffi(a: &ffi::ibv_ah_attr) -> AhAttr {
        let remote = if a.is_global != 0 {
            Remote::Gid {
                gid: Gid::from_ffi(&a.grh.dgid),
                sgid_index: a.grh.sgid_index.into(),
                hop_limit: a.grh.hop_limit,
                traffic_class: a.grh.traffic_class,
                flow_label: a.grh.flow_label,
            }
        } else {
            Remote::Lid { dlid: a.dlid, src_path_bits: a.src_path_bits }
        };
        AhAttr { port: a.port_num, remote, sl: a.sl, static_rate: a.static_rate }
    }

    /// The address that replies to the sender of a received datagram
    /// (`ibv_init_ah_from_wc`): from the receive completion `wc` of a UD QP on `port`,
    /// and `grh`, the first [`GRH_LEN`] (40) bytes of its receive buffer, where the device
    /// put the global route header (on RoCE v2 over IPv4, the IPv4 header in its last 20).
    /// The source GID index is the one the datagram was sent to; the remote QP number and
    /// Q_Key are not part of an address: the reply goes to
    /// [`wc.src_qp()`](WorkCompletion::src_qp).
    ///
    /// Refused before any C call, with [`Error::InvalidArgument`] naming
    /// [`Verb::AhFromCompletion`]: a failed completion, one that is not a receive, a port
    /// the device does not have, a completion without a GRH on a RoCE port (there every
    /// datagram has one), and a `grh` shorter than 40 bytes when the completion has one.
    #[doc(alias = "ibv_init_ah_from_wc")]
    pub fn from_completion(ctx: &Context, port: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<AhAttr> {
        const OURS: Verb = Verb::AhFromCompletion;
        let bad = |what: String| Err(Error::invalid(OURS, what));
        if !wc.is_success() {
            return bad(format!(
                "the completion failed ({}): only a received datagram tells where it came from",
                wc.status()
            ));
        }
        if !wc.opcode().is_recv() {
            return bad(format!(
                "a {} completion is not a receive: only a received datagram tells where it came from",
                wc.opcode()
            ));
        }
        let ports = ctx.query_device()?.phys_port_cnt;
        if port == 0 || port > ports {
            return bad(format!("port {port} does not exist on {} (ports 1..={ports})", ctx.name()));
        }
        let has_grh = wc.wc_flags().contains(WcFlags::GRH);
        if !has_grh && ctx.query_port(port)?.is_ethernet() {
            return bad(format!(
                "the completion has no GRH, but port {port} of {} is Ethernet (RoCE), where every datagram \
                 has one: is this a completion of a UD receive on that port?",
                ctx.name()
            ));
        }
        if has_grh && grh.len() < GRH_LEN {
            return bad(format!(
                "grh has {} bytes: pass the first {GRH_LEN} bytes of the receive buffer, where the device \
                 put the global route header",
                grh.len()
            ));
        }
        // SAFETY: a plain C struct of integers and byte arrays: all zeros is valid.
        let mut raw_grh: ffi::ibv_grh = unsafe { std::mem::zeroed() };
        if has_grh {
            // SAFETY: `grh` has at least GRH_LEN bytes (checked), `raw_grh` is GRH_LEN bytes
            // of plain data, and the two do not overlap (one is a local).
            unsafe { ptr::copy_nonoverlapping(grh.as_ptr(), ptr::addr_of_mut!(raw_grh).cast::<u8>(), GRH_LEN) };
        }
        let mut raw_wc = *wc.as_raw();
        let mut attr = ffi::ibv_ah_attr::default();
        // SAFETY: the context is open and `port` exists; the completion, GRH and attribute
        // are locals the call reads (and writes) only during the call.
        let rc = unsafe { ffi::ibv_init_ah_from_wc(ctx.as_raw(), port, &mut raw_wc, &mut raw_grh, &mut attr) };
        conv::rc(Verb::InitAhFromWc, rc).map_err(|e| match e.errno() {
            Some(libc::ENOENT | libc::EINVAL) => e.with_hint(
                "the GRH's destination GID is not in the port's GID table: is grh the start of this \
                 completion's receive buffer, and is the port the one the datagram arrived on?",
            ),
            _ => e,
        })?;
        Ok(AhAttr::from_ffi(&attr))
    }

    /// Checks the address against the port before any C code sees it: the port exists,
    /// RoCE ports are addressed by GID, the source GID slot is in use, the fields fit.
    pub(crate) fn check(&self, ctx: &Context, verb: Verb) -> Result<PortAttr> {
        let bad = |what: String| Err(Error::invalid(verb, what));
        let port = ctx.query_port(self.port)?;
        if self.sl > 15 {
            return bad(format!("service level {} is above 15", self.sl));
        }
        match self.remote {
            Remote::Lid { .. } if port.is_ethernet() => bad(format!(
                "port {} of {} is Ethernet (RoCE): peers are addressed by GID, use Remote::Gid",
                self.port,
                ctx.name()
            )),
            Remote::Lid { dlid: 0, .. } => bad("LID 0 is reserved: set the remote LID".into()),
            Remote::Lid { .. } => Ok(port),
            Remote::Gid { gid, sgid_index, flow_label, .. } => {
                sgid_index_u8(sgid_index, verb)?;
                if gid.is_zero() {
                    return bad("the remote GID is all zero: set the remote GID".into());
                }
                if flow_label > 0xF_FFFF {
                    return bad(format!("flow label {flow_label:#x} does not fit in 20 bits"));
                }
                if sgid_index >= port.gid_tbl_len {
                    return bad(format!(
                        "sgid_index {sgid_index} is past the GID table of port {} ({} entries)",
                        self.port, port.gid_tbl_len
                    ));
                }
                match ctx.query_gid(self.port, sgid_index) {
                    Ok(e) if !e.gid.is_zero() => Ok(port),
                    _ => bad(format!(
                        "sgid_index {sgid_index} is an empty slot of port {}'s GID table \
                         (Context::default_gid picks a usable one)",
                        self.port
                    )),
                }
            }
        }
    }
}

/// A source GID index as the C field holds it (8 bits), or an error that says it does not fit.
fn sgid_index_u8(index: u32, verb: Verb) -> Result<u8> {
    u8::try_from(index).map_err(|_| {
        Error::invalid(
            verb,
            format!(
                "sgid_index {index} does not fit the 8 bits of ibv_global_route.sgid_index: \
                 only GID table slots 0..=255 can be a source GID"
            ),
        )
    })
}

/// An address handle: the destination of UD sends. Cloning is cheap; the handle keeps its
/// protection domain (and so the device) alive, and is destroyed with its last clone.
#[derive(Clone)]
pub struct AddressHandle {
    pub(crate) inner: Arc<AhInner>,
}

pub(crate) struct AhInner {
    raw: Owned<ffi::ibv_ah>,
    attr: AhAttr,
    pd: ProtectionDomain,
}

// SAFETY: an address handle is immutable after creation; verbs that read it (posting UD
// sends, destroying it once) are thread-safe in libibverbs.
unsafe impl Send for AhInner {}
// SAFETY: as for Send: nothing mutates the handle through a shared reference.
unsafe impl Sync for AhInner {}

impl AddressHandle {
    /// Creates an address handle (`ibv_create_ah`). The address is checked against the
    /// port first; on RoCE the kernel resolves the remote MAC address here.
    ///
    /// A device without address handles (`max_ah` 0: no UD, as iWARP's siw) is refused
    /// before the call with [`Error::NotSupported`] naming [`Verb::AhNew`] and `max_ah`.
    #[doc(alias = "ibv_create_ah")]
    pub fn new(pd: &ProtectionDomain, attr: &AhAttr) -> Result<AddressHandle> {
        if pd.context().query_device()?.raw.max_ah <= 0 {
            return Err(Error::not_supported(
                Verb::AhNew,
                "address handles (UD): the device's max_ah is 0 (ibv_query_device)",
            ));
        }
        attr.check(pd.context(), Verb::CreateAh)?;
        let mut raw_attr = attr.raw(Verb::CreateAh)?;
        // SAFETY: the PD is live and `raw_attr` is a valid address vector for the call.
        let raw = unsafe { ffi::ibv_create_ah(pd.as_raw(), &mut raw_attr) };
        // SAFETY: a new AH that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateAh) }.map_err(|e| match e.errno() {
            Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ENODATA) => {
                e.with_hint("the kernel found no route or neighbour for the remote GID from this source GID")
            }
            _ => e,
        })?;
        Ok(AddressHandle { inner: Arc::new(AhInner { raw, attr: *attr, pd: pd.clone() }) })
    }

    /// An address handle that replies to the sender of a received datagram
    /// (`ibv_create_ah_from_wc`): [`AhAttr::from_completion`] (whose checks it makes, before
    /// any C call), then [`AddressHandle::new`]. Send the reply to
    /// [`wc.src_qp()`](WorkCompletion::src_qp) with the Q_Key both sides agreed on.
    ///
    /// `wc` may already be taken by its queue: after [`RecvQueue::complete`](crate::RecvQueue::complete)
    /// (which clears only its `wr_id`) the completion still says where the datagram came
    /// from, and the GRH is in the buffer that call handed back (`&done.value[..GRH_LEN]`).
    /// examples/ah_from_completion.rs replies that way.
    #[doc(alias = "ibv_create_ah_from_wc")]
    pub fn from_completion(pd: &ProtectionDomain, port: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<AddressHandle> {
        let attr = AhAttr::from_completion(pd.context(), port, wc, grh)?;
        AddressHandle::new(pd, &attr)
    }

    /// The address it was created with.
    pub fn attr(&self) -> &AhAttr {
        &self.inner.attr
    }

    /// The protection domain it belongs to.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The raw pointer (for `ibv_send_wr.wr.ud.ah` and `ibv_wr_set_ud_addr`), valid while
    /// `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.inner.raw.as_ptr()
    }

    /// Destroys the handle now and reports the result (`ibv_destroy_ah`). Fails with
    /// EBUSY, destroying nothing yet, while clones are alive.
    #[doc(alias = "ibv_destroy_ah")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::DestroyAh, |inner| inner.raw.destroy())
    }
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle").field("attr", &self.inner.attr).finish()
    }
}

/// The UDP source port RoCE v2 uses for a packet of this 20-bit IPv6 flow label
/// (`ibv_flow_label_to_udp_sport`): the label's low 14 bits, XORed with its top 6, in
/// the range 0xc000..=0xffff. Switches spread flows over paths by this port, so a
/// program that picks flow labels picks paths.
///
/// A label wider than 20 bits is [`Error::InvalidArgument`] naming
/// [`Verb::UdpSportFromFlowLabel`] (the C function would drop the high bits silently).
#[doc(alias = "ibv_flow_label_to_udp_sport")]
pub fn udp_sport_from_flow_label(flow_label: u32) -> Result<u16> {
    if flow_label > 0xf_ffff {
        return Err(Error::invalid(
            Verb::UdpSportFromFlowLabel,
            format!("flow label {flow_label:#x} is wider than 20 bits"),
        ));
    }
    let low = (flow_label & 0x3fff) ^ (flow_label >> 14);
    Ok((low | 0xc000) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ah_attr_round_trips_through_the_c_struct() {
        let gid = Gid::from(std::net::Ipv4Addr::new(10, 99, 0, 1));
        let global = AhAttr { sl: 3, ..AhAttr::global(1, gid, 1) };
        let raw = global.to_ffi().unwrap();
        assert_eq!((raw.is_global, raw.port_num, raw.sl, raw.grh.sgid_index, raw.grh.hop_limit), (1, 1, 3, 1, 64));
        assert_eq!(AhAttr::from_ffi(&raw), global);
        let by_lid = AhAttr::new(2, Remote::Lid { dlid: 7, src_path_bits: 1 });
        let raw = by_lid.to_ffi().unwrap();
        assert_eq!((raw.is_global, raw.dlid, raw.src_path_bits), (0, 7, 1));
        assert_eq!(AhAttr::from_ffi(&raw), by_lid);
    }

    #[test]
    fn a_gid_entrys_u32_index_is_taken_as_is_and_one_past_8_bits_is_refused_before_c() {
        let gid = Gid::from(std::net::Ipv4Addr::new(10, 99, 0, 1));
        // What Context::default_gid and gid_table hand out: a u32 index, no cast needed.
        let entry_index: u32 = 255;
        let raw = AhAttr::global(1, gid, entry_index).to_ffi().unwrap();
        assert_eq!(raw.grh.sgid_index, 255);
        for index in [256, u32::MAX] {
            let e = AhAttr::global(1, gid, index).to_ffi().err().unwrap();
            assert!(matches!(e, Error::InvalidArgument { verb: Verb::AhAttrToFfi, .. }), "{e}");
            assert!(e.to_string().contains(&format!("sgid_index {index} does not fit the 8 bits")), "{e}");
        }
        let e = AhAttr::global(1, gid, 300).raw(Verb::CreateAh).err().unwrap();
        assert!(
            e.to_string().starts_with("ibv_create_ah: invalid argument (refused before the call): sgid_index 300"),
            "{e}"
        );
    }

    #[test]
    fn a_flow_label_gives_the_port_libibverbs_gives_and_wider_labels_are_refused() {
        for fl in [0u32, 1, 0x3fff, 0x4000, 0x12345, 0xfc000, 0xf_ffff] {
            assert_eq!(udp_sport_from_flow_label(fl).unwrap(), ffi::ibv_flow_label_to_udp_sport(fl), "{fl:#x}");
        }
        assert_eq!(udp_sport_from_flow_label(0).unwrap(), 0xc000);
        assert_eq!(udp_sport_from_flow_label(0x4001).unwrap(), 0xc000);
        assert_eq!(udp_sport_from_flow_label(0x3fff).unwrap(), 0xffff);
        let e = udp_sport_from_flow_label(0x10_0000).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::UdpSportFromFlowLabel, .. }), "{e}");
    }
}
