//! RDMA devices: listing them, opening one, and what the device says about itself.

use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;

use crate::c_enum::c_enum;
use crate::context::Context;
use crate::conv;
use crate::error::{Error, Result, Verb};
use crate::ffi;

/// The devices present when [`devices`] was called (`ibv_get_device_list`).
///
/// A [`Device`] borrows the list; a [`Context`] opened from it does not, so the list can
/// be dropped as soon as the devices of interest are open.
#[doc(alias = "ibv_free_device_list")]
#[doc(alias = "ibv_get_device_list")]
pub struct DeviceList {
    raw: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

/// Lists the RDMA devices of this host. An empty list is not an error; see
/// [`Context::open`] for a call that fails with a hint when nothing is there. With the
/// feature `dlopen`, a libibverbs that cannot be loaded is [`Error::Library`].
#[doc(alias = "ibv_get_device_list")]
pub fn devices() -> Result<DeviceList> {
    // With the feature `dlopen`, the library is loaded here; linked, this is a no-op.
    ffi::dl::load(ffi::dl::Library::Ibverbs)?;
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed by DeviceList's Drop.
    let raw = unsafe { ffi::ibv_get_device_list(&mut n) };
    let raw = conv::ptr(Verb::GetDeviceList, raw)?;
    Ok(DeviceList { raw, len: usize::try_from(n).unwrap_or(0) })
}

impl DeviceList {
    /// How many devices there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the host has no RDMA device.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The devices, in the order libibverbs found them.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Device<'_>> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: the list holds `len` non-null device pointers followed by NULL,
            // and lives as long as `self`.
            let dev = unsafe { *self.raw.as_ptr().add(i) };
            Device { raw: dev, _list: std::marker::PhantomData }
        })
    }

    /// The device with this name.
    pub fn find(&self, name: &str) -> Result<Device<'_>> {
        self.iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::UnknownDevice { name: name.to_owned(), available: self.names().join(", ") })
    }

    /// The names of all devices.
    pub fn names(&self) -> Vec<String> {
        self.iter().map(|d| d.name().to_owned()).collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ibv_get_device_list and is freed once; contexts
        // already opened from it stay valid (libibverbs keeps opened devices alive).
        unsafe { ffi::ibv_free_device_list(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

c_enum! {
    /// The transport of a device (`enum ibv_transport_type`): how its QPs reach a peer.
    Transport: i32 {
        /// InfiniBand's transport, on InfiniBand and RoCE ports: a QP is connected by hand
        /// ([`QueuePair::connect`](crate::QueuePair::connect), an [`Endpoint`](crate::wire::Endpoint))
        /// or through rdma_cm.
        Ib = 0,
        /// iWARP (RDMA over TCP: siw, irdma and cxgb4 in iWARP mode): a QP reaches RTS only
        /// through the TCP connection rdma_cm makes for it ([`CmId`](crate::cm::CmId)).
        Iwarp = 1,
        /// Cisco's usNIC.
        Usnic = 2,
        /// Cisco's usNIC over UDP.
        UsnicUdp = 3,
        /// Not one of the above (EFA's SRD, for one).
        Unspecified = 4,
    }
}

/// One device of a [`DeviceList`].
#[derive(Clone, Copy)]
pub struct Device<'list> {
    raw: *mut ffi::ibv_device,
    _list: std::marker::PhantomData<&'list DeviceList>,
}

impl<'list> Device<'list> {
    /// The kernel's name for the device, e.g. `mlx5_0` or `rxe0`.
    #[doc(alias = "ibv_get_device_name")]
    pub fn name(&self) -> &'list str {
        // SAFETY: the device is valid while the list lives; the name is a NUL-terminated
        // array inside `struct ibv_device` that never changes.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(self.raw)) };
        name.to_str().unwrap_or("?")
    }

    /// The node GUID, in host byte order.
    #[doc(alias = "ibv_get_device_guid")]
    pub fn guid(&self) -> u64 {
        // SAFETY: the device is valid while the list lives.
        u64::from_be(unsafe { ffi::ibv_get_device_guid(self.raw) })
    }

    /// Opens the device (`ibv_open_device`).
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> Result<Context> {
        // SAFETY: the device pointer is valid while the list lives; the context owns
        // what ibv_open_device returns.
        unsafe { Context::from_device(self.raw, self.name()) }
    }

    /// The kernel's index of the device (`ibv_get_device_index`), the number `rdma dev`
    /// prints before the name; `None` where the kernel does not say.
    #[doc(alias = "ibv_get_device_index")]
    pub fn index(&self) -> Option<u32> {
        // SAFETY: the device is valid while the list lives.
        u32::try_from(unsafe { ffi::ibv_get_device_index(self.raw) }).ok()
    }

    /// The device's transport, as libibverbs set it when it listed the device.
    pub fn transport(&self) -> Transport {
        // SAFETY: the device is valid while the list lives; `transport_type` is a plain
        // field libibverbs wrote once.
        Transport::from_raw(unsafe { (*self.raw).transport_type.0 })
    }

    /// The raw device pointer.
    pub fn as_raw(&self) -> *mut ffi::ibv_device {
        self.raw
    }
}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("guid", &format_args!("{:016x}", self.guid()))
            .finish()
    }
}

/// What the device can do (`ibv_query_device`), with the fields most programs check
/// typed and the rest in [`raw`](DeviceAttr::raw).
#[derive(Clone)]
pub struct DeviceAttr {
    /// Firmware version as the device reports it (`0.0.0` on rxe).
    pub fw_ver: String,
    /// Node GUID, host byte order.
    pub node_guid: u64,
    /// System image GUID, host byte order.
    pub sys_image_guid: u64,
    /// IEEE OUI of the vendor.
    pub vendor_id: u32,
    /// Vendor's part id (4125 for ConnectX-6 Dx, for instance).
    pub vendor_part_id: u32,
    /// Hardware revision.
    pub hw_ver: u32,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most outstanding work requests on one queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries in one work request.
    pub max_sge: u32,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries in one completion queue.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most shared receive queues.
    pub max_srq: u32,
    /// Most work requests in one shared receive queue.
    pub max_srq_wr: u32,
    /// Most outstanding RDMA READs and atomics a QP can be the target of.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA READs and atomics a QP can initiate.
    pub max_qp_init_rd_atom: u32,
    /// Whether and how atomics are supported.
    pub atomic_cap: AtomicCap,
    /// Number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
    /// Everything `ibv_query_device` returned.
    pub raw: ffi::ibv_device_attr,
}

impl DeviceAttr {
    pub(crate) fn from_raw(a: &ffi::ibv_device_attr) -> Self {
        let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
        // SAFETY: fw_ver is a fixed C array the kernel fills with a NUL-terminated string;
        // from_bytes_until_nul stops at the array's end if the NUL is missing.
        let fw = unsafe { std::slice::from_raw_parts(a.fw_ver.as_ptr().cast::<u8>(), a.fw_ver.len()) };
        DeviceAttr {
            fw_ver: CStr::from_bytes_until_nul(fw).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default(),
            node_guid: u64::from_be(a.node_guid),
            sys_image_guid: u64::from_be(a.sys_image_guid),
            vendor_id: a.vendor_id,
            vendor_part_id: a.vendor_part_id,
            hw_ver: a.hw_ver,
            max_mr_size: a.max_mr_size,
            max_qp: nonneg(a.max_qp),
            max_qp_wr: nonneg(a.max_qp_wr),
            max_sge: nonneg(a.max_sge),
            max_cq: nonneg(a.max_cq),
            max_cqe: nonneg(a.max_cqe),
            max_mr: nonneg(a.max_mr),
            max_pd: nonneg(a.max_pd),
            max_srq: nonneg(a.max_srq),
            max_srq_wr: nonneg(a.max_srq_wr),
            max_qp_rd_atom: nonneg(a.max_qp_rd_atom),
            max_qp_init_rd_atom: nonneg(a.max_qp_init_rd_atom),
            atomic_cap: AtomicCap::from_raw(a.atomic_cap),
            phys_port_cnt: a.phys_port_cnt,
            raw: *a,
        }
    }
}

impl fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("fw_ver", &self.fw_ver)
            .field("node_guid", &format_args!("{:016x}", self.node_guid))
            .field("vendor_id", &format_args!("{:#x}", self.vendor_id))
            .field("vendor_part_id", &self.vendor_part_id)
            .field("hw_ver", &self.hw_ver)
            .field("max_mr_size", &self.max_mr_size)
            .field("max_qp", &self.max_qp)
            .field("max_qp_wr", &self.max_qp_wr)
            .field("max_sge", &self.max_sge)
            .field("max_cqe", &self.max_cqe)
            .field("atomic_cap", &self.atomic_cap)
            .field("phys_port_cnt", &self.phys_port_cnt)
            .finish_non_exhaustive()
    }
}

/// Atomic operation support (`enum ibv_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic with respect to this device only.
    Hca,
    /// Atomic with respect to the CPU too.
    Global,
    /// A value this crate does not know.
    Unknown(u32),
}

impl AtomicCap {
    fn from_raw(v: ffi::ibv_atomic_cap) -> Self {
        match v {
            ffi::ibv_atomic_cap::IBV_ATOMIC_NONE => AtomicCap::None,
            ffi::ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCap::Hca,
            ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCap::Global,
            other => AtomicCap::Unknown(other.0),
        }
    }

    /// True when RDMA atomics work at all.
    pub fn supported(self) -> bool {
        matches!(self, AtomicCap::Hca | AtomicCap::Global)
    }
}
