//! Flow steering rules (`struct ibv_flow`): packets that match a spec (Ethernet
//! destination, IPv4 addresses, UDP ports) go to a QP, optionally counted.

use std::ffi::c_int;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::caps::device_attr_ex;
use crate::codes::QpType;
use crate::counters::{CounterKind, Counters};
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{Owned, RawObject};
use crate::qp::{QpInner, QueuePair};

impl RawObject for ffi::ibv_flow {
    const DESTROY: Verb = Verb::DestroyFlow;
    unsafe fn destroy(raw: *mut Self) -> c_int {
        // SAFETY: forwarded from the caller's contract.
        unsafe { ffi::ibv_destroy_flow(raw) }
    }
}

/// The bytes of a C struct with these fields, its padding zero: built in zeroed memory
/// and never moved as a value (a move may leave padding undefined).
macro_rules! c_struct {
    ($t:ty { $($f:ident : $v:expr),* $(,)? }) => {{
        let mut m = std::mem::MaybeUninit::<$t>::zeroed();
        let p = m.as_mut_ptr();
        // SAFETY: `p` points at a live, zeroed value; each write fills one field in place.
        unsafe { $(std::ptr::addr_of_mut!((*p).$f).write($v);)* }
        // SAFETY: every byte was zeroed and some then overwritten by fields: all are
        // initialised, and `m` lives while they are read.
        unsafe { std::slice::from_raw_parts(m.as_ptr().cast::<u8>(), size_of::<$t>()) }.to_vec()
    }};
}

/// What packets a [`Flow`] steers (`struct ibv_flow_attr` and the specs after it): each
/// field set is matched exactly, layer by layer (Ethernet, IPv4, UDP), and what is not
/// set matches anything.
#[derive(Clone, Default)]
pub struct FlowSpec {
    port: u8,
    priority: u16,
    eth_dst: Option<[u8; 6]>,
    ipv4_src: Option<Ipv4Addr>,
    ipv4_dst: Option<Ipv4Addr>,
    udp_src: Option<u16>,
    udp_dst: Option<u16>,
    counters: Option<Arc<Counters>>,
}

impl FlowSpec {
    /// A rule for packets arriving on `port` (from 1), at priority 0 (the highest).
    pub fn new(port: u8) -> FlowSpec {
        FlowSpec { port, ..FlowSpec::default() }
    }

    /// The rule's priority: lower values are matched first.
    pub fn priority(mut self, priority: u16) -> Self {
        self.priority = priority;
        self
    }

    /// Matches the Ethernet destination address.
    pub fn eth_dst(mut self, mac: [u8; 6]) -> Self {
        self.eth_dst = Some(mac);
        self
    }

    /// Matches the IPv4 source and destination addresses (`None`: any).
    pub fn ipv4(mut self, src: Option<Ipv4Addr>, dst: Option<Ipv4Addr>) -> Self {
        self.ipv4_src = src;
        self.ipv4_dst = dst;
        self
    }

    /// Matches the UDP source and destination ports (`None`: any); needs an IPv4 match.
    pub fn udp(mut self, src: Option<u16>, dst: Option<u16>) -> Self {
        self.udp_src = src;
        self.udp_dst = dst;
        self
    }

    /// Counts what the rule matches in `counters`, whose points are attached before
    /// ([`Counters::attach`]); the flow keeps them (`IBV_FLOW_SPEC_ACTION_COUNT`).
    pub fn count(mut self, counters: Arc<Counters>) -> Self {
        self.counters = Some(counters);
        self
    }

    fn has_ipv4(&self) -> bool {
        self.ipv4_src.is_some() || self.ipv4_dst.is_some() || self.udp_src.is_some() || self.udp_dst.is_some()
    }

    /// The checks before `ibv_create_flow` that need no device.
    fn check(&self, qp_type: QpType) -> Result<()> {
        let v = Verb::FlowNew;
        if qp_type != QpType::Ud {
            return Err(Error::invalid(v, format!("a {qp_type} QP: flows steer to UD (or raw packet) QPs")));
        }
        if self.port == 0 {
            return Err(Error::invalid(v, "port 0: ports are numbered from 1"));
        }
        if self.eth_dst.is_none() && !self.has_ipv4() {
            return Err(Error::invalid(v, "nothing to match: set an Ethernet, IPv4 or UDP field"));
        }
        if (self.udp_src.is_some() || self.udp_dst.is_some()) && self.ipv4_src.is_none() && self.ipv4_dst.is_none() {
            return Err(Error::invalid(v, "a UDP match needs an IPv4 match below it (an address to match)"));
        }
        Ok(())
    }

    /// The C attribute followed by its specs, packed, as ibv_create_flow(3) reads them;
    /// in u64s for the alignment of the attribute.
    fn encode(&self) -> Vec<u64> {
        let mut bytes: Vec<u8> = Vec::with_capacity(128);
        let mut n_specs = 0u8;
        let mut push = |b: &[u8]| {
            bytes.extend_from_slice(b);
            n_specs += 1;
        };
        use ffi::ibv_flow_spec_type as T;
        if let Some(mac) = self.eth_dst {
            let mut val = ffi::ibv_flow_eth_filter { dst_mac: mac, src_mac: [0; 6], ether_type: 0, vlan_tag: 0 };
            let mut mask = ffi::ibv_flow_eth_filter { dst_mac: [0xff; 6], src_mac: [0; 6], ether_type: 0, vlan_tag: 0 };
            if self.has_ipv4() {
                val.ether_type = 0x0800u16.to_be();
                mask.ether_type = 0xffff;
            }
            let size = size_of::<ffi::ibv_flow_spec_eth>() as u16;
            push(&c_struct!(ffi::ibv_flow_spec_eth { type_: T::IBV_FLOW_SPEC_ETH, size: size, val: val, mask: mask }));
        }
        if self.has_ipv4() {
            let ip = |a: Option<Ipv4Addr>| a.map_or((0, 0), |a| (u32::from(a).to_be(), u32::MAX));
            let ((src, src_m), (dst, dst_m)) = (ip(self.ipv4_src), ip(self.ipv4_dst));
            let val = ffi::ibv_flow_ipv4_filter { src_ip: src, dst_ip: dst };
            let mask = ffi::ibv_flow_ipv4_filter { src_ip: src_m, dst_ip: dst_m };
            let size = size_of::<ffi::ibv_flow_spec_ipv4>() as u16;
            push(&c_struct!(ffi::ibv_flow_spec_ipv4 {
                type_: T::IBV_FLOW_SPEC_IPV4,
                size: size,
                val: val,
                mask: mask
            }));
        }
        if self.udp_src.is_some() || self.udp_dst.is_some() {
            let port = |p: Option<u16>| p.map_or((0, 0), |p| (p.to_be(), u16::MAX));
            let ((src, src_m), (dst, dst_m)) = (port(self.udp_src), port(self.udp_dst));
            let val = ffi::ibv_flow_tcp_udp_filter { dst_port: dst, src_port: src };
            let mask = ffi::ibv_flow_tcp_udp_filter { dst_port: dst_m, src_port: src_m };
            let size = size_of::<ffi::ibv_flow_spec_tcp_udp>() as u16;
            push(&c_struct!(ffi::ibv_flow_spec_tcp_udp {
                type_: T::IBV_FLOW_SPEC_UDP,
                size: size,
                val: val,
                mask: mask
            }));
        }
        if let Some(c) = &self.counters {
            let size = size_of::<ffi::ibv_flow_spec_counter_action>() as u16;
            push(&c_struct!(ffi::ibv_flow_spec_counter_action {
                type_: T::IBV_FLOW_SPEC_ACTION_COUNT,
                size: size,
                counters: c.as_raw(),
            }));
        }
        let total = (size_of::<ffi::ibv_flow_attr>() + bytes.len()) as u16;
        let mut all = c_struct!(ffi::ibv_flow_attr {
            comp_mask: 0,
            type_: ffi::ibv_flow_attr_type::IBV_FLOW_ATTR_NORMAL,
            size: total,
            priority: self.priority,
            num_of_specs: n_specs,
            port: self.port,
            flags: 0,
        });
        all.extend_from_slice(&bytes);
        let mut out = vec![0u64; all.len().div_ceil(8)];
        // SAFETY: `out` has at least `all.len()` bytes, and the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), out.as_mut_ptr().cast::<u8>(), all.len()) };
        out
    }
}

impl fmt::Debug for FlowSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowSpec")
            .field("port", &self.port)
            .field("priority", &self.priority)
            .field("eth_dst", &self.eth_dst)
            .field("ipv4", &(self.ipv4_src, self.ipv4_dst))
            .field("udp", &(self.udp_src, self.udp_dst))
            .field("counted", &self.counters.is_some())
            .finish()
    }
}

/// Why a device with `device_cap_flags` cannot steer flows, or `None`.
fn flow_refusal(device_cap_flags: u32) -> Option<&'static str> {
    let bit = ffi::ibv_device_cap_flags::IBV_DEVICE_MANAGED_FLOW_STEERING.0;
    (device_cap_flags & bit == 0).then_some(
        "flow steering: the device's device_cap_flags lack IBV_DEVICE_MANAGED_FLOW_STEERING (ibv_query_device_ex)",
    )
}

/// A flow steering rule on a QP (`ibv_create_flow`), removed on drop (`ibv_destroy_flow`)
/// before the QP and the counters it holds are released.
///
/// What it promises: [`new`](Flow::new) refuses before C ([`Error::InvalidArgument`]
/// naming [`Verb::FlowNew`]) a QP that is not UD, port 0, a spec that matches nothing, a
/// UDP match with no IPv4 address; then checks the device's `device_cap_flags` for
/// `IBV_DEVICE_MANAGED_FLOW_STEERING`, and a device without it (rxe) gives
/// [`Error::NotSupported`] naming [`Verb::FlowNew`] and that bit.
pub struct Flow {
    raw: Owned<ffi::ibv_flow>,
    _counters: Option<Arc<Counters>>,
    _qp: Arc<QpInner>,
}

// SAFETY: a kernel object that any thread may destroy; the QP and counters are Send+Sync.
unsafe impl Send for Flow {}
// SAFETY: &Flow gives only the raw pointer and attaches counters (provider-serialised).
unsafe impl Sync for Flow {}

impl Flow {
    /// Steers what `spec` matches to `qp` (`ibv_create_flow`).
    #[doc(alias = "ibv_create_flow")]
    pub fn new(qp: &QueuePair, spec: &FlowSpec) -> Result<Flow> {
        spec.check(qp.qp_type())?;
        if let Some(why) = flow_refusal(device_attr_ex(qp.context())?.orig_attr.device_cap_flags) {
            return Err(Error::not_supported(Verb::FlowNew, why));
        }
        let mut buf = spec.encode();
        // SAFETY: the QP is live; `buf` holds the attribute and its specs as the C call
        // reads them, and any counters named are live (the spec holds them).
        let raw = unsafe { ffi::ibv_create_flow(qp.as_raw(), buf.as_mut_ptr().cast()) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::CreateFlow,
                "flow steering: the provider has no create_flow",
            ));
        }
        // SAFETY: a new flow that only this Owned destroys.
        let raw = unsafe { Owned::new(raw, Verb::CreateFlow)? };
        Ok(Flow { raw, _counters: spec.counters.clone(), _qp: qp.inner.clone() })
    }

    /// Attaches a counting point of `kind` at `index` of `counters` to this live flow
    /// (`ibv_attach_counters_point_flow`).
    #[doc(alias = "ibv_attach_counters_point_flow")]
    pub fn attach_counters(&self, counters: &Counters, kind: CounterKind, index: u32) -> Result<()> {
        counters.attach_raw(kind, index, self.raw.as_ptr())
    }

    /// The raw flow, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_flow {
        self.raw.as_ptr()
    }

    /// Removes the rule now (`ibv_destroy_flow`) and reports the result.
    #[doc(alias = "ibv_destroy_flow")]
    pub fn destroy(self) -> Result<()> {
        let Flow { raw, .. } = self;
        raw.destroy()
    }
}

impl fmt::Debug for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Flow").field("raw", &self.raw.as_ptr()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_checked_before_c() {
        let good = FlowSpec::new(1)
            .eth_dst([2, 0, 0, 0, 0, 1])
            .ipv4(None, Some(Ipv4Addr::new(10, 0, 0, 1)))
            .udp(None, Some(4791));
        assert!(good.check(QpType::Ud).is_ok());
        let e = good.check(QpType::Rc).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::FlowNew, .. }), "{e}");
        assert!(FlowSpec::new(1).check(QpType::Ud).unwrap_err().to_string().contains("nothing to match"));
        assert!(FlowSpec::new(0).eth_dst([0; 6]).check(QpType::Ud).is_err());
        let e = FlowSpec::new(1).udp(None, Some(1)).check(QpType::Ud).unwrap_err();
        assert!(e.to_string().contains("IPv4"), "{e}");
    }

    #[test]
    fn the_attribute_and_its_specs_are_packed_in_order_in_network_byte_order() {
        let spec = FlowSpec::new(1)
            .priority(3)
            .eth_dst([2, 0, 0, 0, 0, 1])
            .ipv4(None, Some(Ipv4Addr::new(10, 0, 0, 1)))
            .udp(None, Some(4791));
        let buf = spec.encode();
        // SAFETY: `buf` is a live Vec of at least the bytes read.
        let b = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) };
        let (attr, eth, ip, udp) = (20, 40, 24, 16);
        assert_eq!(u16::from_ne_bytes([b[8], b[9]]) as usize, attr + eth + ip + udp, "size counts the specs");
        assert_eq!(u16::from_ne_bytes([b[10], b[11]]), 3, "priority");
        assert_eq!((b[12], b[13]), (3, 1), "three specs, port 1");
        assert_eq!(u32::from_ne_bytes(b[20..24].try_into().unwrap()), 0x20, "Ethernet first");
        assert_eq!(&b[26..32], &[2, 0, 0, 0, 0, 1], "destination MAC after the 6-byte header");
        assert_eq!(&b[38..40], &[0x08, 0x00], "ether_type IPv4, big-endian");
        assert_eq!(u32::from_ne_bytes(b[60..64].try_into().unwrap()), 0x30, "then IPv4");
        assert_eq!(&b[72..76], &[10, 0, 0, 1], "destination address in network order");
        assert_eq!(u32::from_ne_bytes(b[84..88].try_into().unwrap()), 0x41, "then UDP");
        assert_eq!(&b[90..92], &4791u16.to_be_bytes(), "destination port after the 6-byte header");
        assert_eq!(&b[94..96], &[0xff, 0xff], "its mask");
    }

    #[test]
    fn a_device_without_managed_flow_steering_is_refused_naming_the_bit() {
        assert!(flow_refusal(0).unwrap().contains("IBV_DEVICE_MANAGED_FLOW_STEERING"));
        assert_eq!(flow_refusal(ffi::ibv_device_cap_flags::IBV_DEVICE_MANAGED_FLOW_STEERING.0), None);
    }
}
