//! An open device (`struct ibv_context`): the root every other object hangs from.

use std::ffi::CStr;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::conv;
use crate::device::{devices, DeviceAttr, Transport};
use crate::error::{Error, Result, Verb};
use crate::ffi;
use crate::handle::{destroy_shared, Owned};
use crate::port::{choose_roce_gid, GidEntry, PortAttr};

/// An open RDMA device. Cloning is cheap (a reference count); the device is closed when
/// the last clone and the last object created from it are gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    raw: RawContext,
    name: String,
    ports: u8,
}

/// Who closes the C context.
enum RawContext {
    /// Opened by this crate (`ibv_open_device`): closed with the last handle.
    Owned(Owned<ffi::ibv_context>),
    /// Opened by librdmacm for the device a CM id is bound to. librdmacm closes it, never
    /// this crate; `_keep` holds the CM id, whose device reference keeps it open.
    Borrowed { raw: NonNull<ffi::ibv_context>, _keep: Arc<dyn Send + Sync> },
}

// SAFETY: libibverbs documents every verb on a context as thread-safe, and providers
// lock their shared state; the context pointer itself is immutable once opened.
unsafe impl Send for ContextInner {}
// SAFETY: see Send: concurrent verbs on one context are allowed.
unsafe impl Sync for ContextInner {}

impl Context {
    /// Opens the device with this name, or the first device when `name` is `None`.
    pub fn open(name: Option<&str>) -> Result<Context> {
        let list = devices()?;
        match name {
            Some(name) => list.find(name)?.open(),
            None => list.iter().next().ok_or(Error::NoDevice)?.open(),
        }
    }

    /// Opens the first device.
    pub fn open_first() -> Result<Context> {
        Self::open(None)
    }

    /// # Safety
    /// `dev` must be a valid device pointer from a live device list.
    pub(crate) unsafe fn from_device(dev: *mut ffi::ibv_device, name: &str) -> Result<Context> {
        // SAFETY: the caller guarantees `dev` is valid.
        let raw = unsafe { ffi::ibv_open_device(dev) };
        // SAFETY: a new context that only this Owned closes.
        let raw = unsafe { Owned::new(raw, Verb::OpenDevice)? };
        Self::with_raw(RawContext::Owned(raw), name.to_owned())
    }

    /// A handle on a context that librdmacm opened for a CM id (`id->verbs`). It never
    /// closes the context; it holds `keep` (the CM id) as long as it lives, which keeps
    /// librdmacm's reference on the device.
    ///
    /// # Safety
    /// `raw` must be the live context of a CM id that `keep` keeps from being destroyed.
    pub(crate) unsafe fn borrowed(raw: NonNull<ffi::ibv_context>, keep: Arc<dyn Send + Sync>) -> Result<Context> {
        // SAFETY: the context is live (caller); libibverbs sets `device` when opening it, and
        // the device name is a NUL-terminated array inside the device struct.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((*raw.as_ptr()).device)) };
        let name = name.to_string_lossy().into_owned();
        Self::with_raw(RawContext::Borrowed { raw, _keep: keep }, name)
    }

    fn with_raw(raw: RawContext, name: String) -> Result<Context> {
        let ctx = Context { inner: Arc::new(ContextInner { raw, name, ports: 0 }) };
        let ports = ctx.query_device()?.phys_port_cnt;
        // Only this function holds the Arc yet.
        let mut ctx = ctx;
        if let Some(inner) = Arc::get_mut(&mut ctx.inner) {
            inner.ports = ports;
        }
        Ok(ctx)
    }

    /// Closes the device now and reports the result (`ibv_close_device`). Fails with
    /// EBUSY, freeing nothing yet, while clones or objects created from it are alive.
    /// A context from a CM id ([`CmId::context`](crate::cm::CmId::context)) is librdmacm's:
    /// this releases the handle and leaves the device open.
    #[doc(alias = "ibv_close_device")]
    pub fn destroy(self) -> Result<()> {
        destroy_shared(self.inner, Verb::CloseDevice, |inner| match inner.raw {
            RawContext::Owned(raw) => raw.destroy(),
            RawContext::Borrowed { .. } => Ok(()),
        })
    }

    /// The command descriptor of this context (`ibv_context::cmd_fd`), to share the context
    /// with another process: send a duplicate of it (`try_clone_to_owned`, or over a UNIX
    /// socket with `SCM_RIGHTS`) and [`import`](Context::import) it there. The two contexts
    /// then name the same kernel objects, by the handles
    /// [`ProtectionDomain::handle`](crate::ProtectionDomain::handle) and
    /// [`MemoryRegion::handle`](crate::MemoryRegion::handle) give.
    pub fn cmd_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the context is open, and libibverbs keeps `cmd_fd` open until it closes the
        // context, which `self` keeps from happening for the borrow's lifetime.
        unsafe { BorrowedFd::borrow_raw((*self.as_raw()).cmd_fd) }
    }

    /// Imports a context another one shared ([`cmd_fd`](Context::cmd_fd), duplicated, maybe
    /// received from another process), with `ibv_import_device`: the new context names
    /// the same kernel objects, and closing it (drop, [`destroy`](Context::destroy)) closes
    /// `fd` and destroys none of them.
    ///
    /// A descriptor that is not a character device is refused before C
    /// ([`Error::InvalidArgument`] naming [`Verb::ContextImport`]) and closed. Once the call
    /// is made the descriptor is libibverbs': on success the context owns it; on failure
    /// libibverbs has closed it or not depending on where it failed (it closes it when the
    /// provider's import fails, not when the provider has none), so this function never
    /// closes it afterwards, and a failed import may leave it open until the process exits.
    /// A provider without import (rxe, and every one but mlx5 in rdma-core 44) gives
    /// [`Error::NotSupported`] naming [`Verb::ImportDevice`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_import_device")]
    pub fn import(fd: OwnedFd) -> Result<Context> {
        // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open (we own it) and `st` is a writable stat.
        let rc = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
        if rc != 0 || st.st_mode & libc::S_IFMT != libc::S_IFCHR {
            return Err(Error::invalid(
                Verb::ContextImport,
                "the descriptor is not a character device (a context's cmd_fd is /dev/infiniband/uverbsN)",
            ));
        }
        ffi::dl::load(ffi::dl::Library::Ibverbs)?;
        let fd = fd.into_raw_fd();
        // SAFETY: `fd` is an open descriptor we hand over to libibverbs (see above).
        let raw = unsafe { ffi::ibv_import_device(fd) };
        if raw.is_null() {
            return Err(Error::last_os_or_not_supported(
                Verb::ImportDevice,
                "the import of a context (the provider has no import_context)",
            ));
        }
        // SAFETY: a new context that only this Owned closes (ibv_close_device, which closes `fd`).
        let raw = unsafe { Owned::new(raw, Verb::ImportDevice)? };
        // SAFETY: the context is live; libibverbs sets `device`, whose name is a
        // NUL-terminated array inside the device struct.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((*raw.as_ptr()).device)) };
        let name = name.to_string_lossy().into_owned();
        Self::with_raw(RawContext::Owned(raw), name)
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw context pointer, valid while `self` lives.
    pub fn as_raw(&self) -> *mut ffi::ibv_context {
        match &self.inner.raw {
            RawContext::Owned(raw) => raw.as_ptr(),
            RawContext::Borrowed { raw, .. } => raw.as_ptr(),
        }
    }

    /// The device's transport: [`Transport::Iwarp`] for an iWARP device, whose QPs connect
    /// only through rdma_cm.
    pub fn transport(&self) -> Transport {
        // SAFETY: the context is open; libibverbs set its `device`, which outlives it, and
        // wrote `transport_type` once when it listed the device.
        Transport::from_raw(unsafe { (*(*self.as_raw()).device).transport_type.0 })
    }

    /// Device attributes (`ibv_query_device`).
    #[doc(alias = "ibv_query_device")]
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr is plain data; all-zero is a valid value.
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_device(self.as_raw(), &mut attr) };
        conv::rc(Verb::QueryDevice, rc)?;
        Ok(DeviceAttr::from_raw(&attr))
    }

    /// Port attributes (`ibv_query_port`). Ports are numbered from 1.
    #[doc(alias = "ibv_query_port")]
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.check_port(Verb::QueryPort, port)?;
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value.
        let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open, the port exists, `attr` is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_port(self.as_raw(), port, &mut attr) };
        conv::rc(Verb::QueryPort, rc)?;
        Ok(PortAttr::from_raw(&attr))
    }

    /// The port's GID table, empty slots left out (one `ibv_query_gid_table` call).
    #[doc(alias = "ibv_query_gid_table")]
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        self.check_port(Verb::QueryGidTable, port)?;
        // The call returns the valid entries of every port; size the buffer for all.
        let mut max = 0usize;
        for p in 1..=self.inner.ports {
            max += self.query_port(p)?.gid_tbl_len as usize;
        }
        // SAFETY: ibv_gid_entry is plain data; all-zero is a valid value.
        let mut entries = vec![unsafe { std::mem::zeroed::<ffi::ibv_gid_entry>() }; max];
        // SAFETY: the context is open and `entries` has room for `max` entries.
        let n = unsafe { ffi::ibv_query_gid_table(self.as_raw(), entries.as_mut_ptr(), max, 0) };
        if n < 0 {
            return Err(Error::verb(Verb::QueryGidTable, (-n) as i32));
        }
        entries.truncate(n as usize);
        Ok(entries.iter().filter(|e| e.port_num == u32::from(port)).map(GidEntry::from_raw).collect())
    }

    /// One GID table entry. An index past the table is an error, not a zero GID.
    #[doc(alias = "ibv_query_gid_ex", alias = "ibv_query_gid")]
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        let len = self.query_port(port)?.gid_tbl_len;
        if index >= len {
            return Err(Error::invalid(
                Verb::QueryGidEx,
                format!("GID index {index} is past the table of port {port} ({len} entries)"),
            ));
        }
        self.query_gid_raw(port, index).map(|e| GidEntry::from_raw(&e))
    }

    fn query_gid_raw(&self, port: u8, index: u32) -> Result<ffi::ibv_gid_entry> {
        // SAFETY: ibv_gid_entry is plain data; all-zero is a valid value.
        let mut entry: ffi::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `entry` is a valid out-pointer of the size given.
        let rc = unsafe { ffi::ibv_query_gid_ex(self.as_raw(), u32::from(port), index, &mut entry, 0) };
        conv::rc(Verb::QueryGidEx, rc)?;
        Ok(entry)
    }

    /// The GID to connect with on this port, chosen as the connection code does by
    /// default: on RoCE, RoCE v2 with an IPv4-mapped address first (see
    /// [`choose_roce_gid`]); on InfiniBand, index 0.
    pub fn default_gid(&self, port: u8) -> Result<GidEntry> {
        let attr = self.query_port(port)?;
        if !attr.is_ethernet() {
            return self.query_gid(port, 0);
        }
        let table = self.gid_table(port)?;
        choose_roce_gid(&table).cloned().ok_or_else(|| Error::NoRoceV2Gid { device: self.name().to_owned(), port })
    }

    /// The P_Key at `index` of the port's P_Key table (`ibv_query_pkey`), in host byte
    /// order: `0xffff` is the default full-membership key, the one rxe has at index 0.
    ///
    /// Refused before C ([`Error::InvalidArgument`] naming [`Verb::ContextPkey`]): a port
    /// the device does not have, an index at or past the port's `pkey_tbl_len`.
    #[doc(alias = "ibv_query_pkey")]
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.check_port(Verb::ContextPkey, port)?;
        let len = self.query_port(port)?.raw.pkey_tbl_len;
        check_pkey_index(index, len)?;
        let mut pkey: ffi::__be16 = 0;
        // SAFETY: the context is open, the port exists and `pkey` is writable.
        let rc = unsafe { ffi::ibv_query_pkey(self.as_raw(), port, index.into(), &mut pkey) };
        conv::rc(Verb::QueryPkey, rc)?;
        Ok(u16::from_be(pkey))
    }

    /// The index of `pkey` (host byte order) in the port's P_Key table
    /// (`ibv_get_pkey_index`), or `None` when the table does not hold it. The index is
    /// what a QP's `pkey_index` attribute takes.
    #[doc(alias = "ibv_get_pkey_index")]
    pub fn pkey_index(&self, port: u8, pkey: u16) -> Result<Option<u16>> {
        self.check_port(Verb::ContextPkey, port)?;
        // SAFETY: the context is open and the port exists.
        let rc = unsafe { ffi::ibv_get_pkey_index(self.as_raw(), port, pkey.to_be()) };
        if rc >= 0 {
            return Ok(u16::try_from(rc).ok());
        }
        // The C function reads the table until a read fails: past its end, that read's
        // error is ENOENT (no such sysfs file), which means "not in the table".
        let e = Error::last_os(Verb::GetPkeyIndex);
        match e.errno() {
            Some(libc::ENOENT) => Ok(None),
            _ => Err(e),
        }
    }

    /// The kernel's index of this device (`ibv_get_device_index`), the number `rdma dev`
    /// prints before the name and netlink uses; `None` where the kernel does not say.
    #[doc(alias = "ibv_get_device_index")]
    pub fn device_index(&self) -> Option<u32> {
        // SAFETY: the context is open, so its device is valid.
        let idx = unsafe { ffi::ibv_get_device_index((*self.as_raw()).device) };
        u32::try_from(idx).ok()
    }

    /// The device's free-running clock now, in its own cycles (`ibv_query_rt_values_ex`
    /// with `IBV_VALUES_MASK_RAW_CLOCK`): the clock of completion timestamps, which
    /// `hca_core_clock` (kHz, `ibv_query_device_ex`) turns into time.
    ///
    /// The device's `hca_core_clock` is read first: 0 (rxe) gives [`Error::NotSupported`]
    /// naming [`Verb::QueryRtValuesEx`] and the field, before the call; a provider without
    /// the verb gives the same with `EOPNOTSUPP`.
    #[doc(alias = "ibv_query_rt_values_ex")]
    pub fn raw_clock(&self) -> Result<u64> {
        let khz = crate::caps::device_attr_ex(self)?.hca_core_clock;
        check_core_clock(khz)?;
        // SAFETY: plain data, for which all zeros is valid.
        let mut values: ffi::ibv_values_ex = unsafe { std::mem::zeroed() };
        values.comp_mask = ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0;
        // SAFETY: the context is open and `values` is writable.
        let rc = unsafe { ffi::ibv_query_rt_values_ex(self.as_raw(), &mut values) };
        if rc != 0 {
            return Err(Error::verb_or_not_supported(
                Verb::QueryRtValuesEx,
                rc.abs(),
                "the device clock: the provider has no query_rt_values",
            ));
        }
        // The raw clock comes in a timespec: providers put the cycles in tv_nsec (mlx5)
        // or split them as seconds and nanoseconds; either way this sum is the count.
        let t = values.raw_clock;
        Ok((t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64))
    }

    fn check_port(&self, verb: Verb, port: u8) -> Result<()> {
        let ports = self.inner.ports;
        if port == 0 || port > ports {
            return Err(Error::invalid(
                verb,
                format!("port {port} does not exist on {} (ports 1..={ports})", self.name()),
            ));
        }
        Ok(())
    }
}

/// A device whose `hca_core_clock` is 0 has no clock to read.
fn check_core_clock(khz: u64) -> Result<()> {
    if khz == 0 {
        return Err(Error::not_supported(
            Verb::QueryRtValuesEx,
            "the device clock: the device reports hca_core_clock 0 (ibv_query_device_ex)",
        ));
    }
    Ok(())
}

/// The check of [`Context::query_pkey`] on `index` against the table's `len`.
fn check_pkey_index(index: u16, len: u16) -> Result<()> {
    if index >= len {
        return Err(Error::invalid(
            Verb::ContextPkey,
            format!("P_Key index {index} is past the port's table of {len} entries (pkey_tbl_len)"),
        ));
    }
    Ok(())
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.inner.name).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pkey_index_past_the_table_is_refused_before_c_naming_query_pkey() {
        assert!(check_pkey_index(0, 1).is_ok());
        assert!(check_pkey_index(63, 64).is_ok());
        let e = check_pkey_index(1, 1).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::ContextPkey, .. }), "{e}");
        assert!(e.to_string().contains("pkey_tbl_len"), "{e}");
        assert!(check_pkey_index(0, 0).is_err());
    }

    #[test]
    fn a_device_without_a_core_clock_has_no_clock_to_read() {
        let e = check_core_clock(0).unwrap_err();
        assert!(matches!(&e, Error::NotSupported { verb: Verb::QueryRtValuesEx, errno: None, .. }), "{e}");
        assert!(e.to_string().contains("hca_core_clock 0"), "{e}");
        assert!(check_core_clock(156_250).is_ok());
    }

    #[test]
    fn importing_a_descriptor_that_is_not_a_character_device_is_refused_before_c_and_closes_it() {
        use std::io::Write;
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe(2) just opened both, and nothing else owns them.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let e = Context::import(read).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::ContextImport, .. }), "{e}");
        assert!(e.to_string().contains("not a character device"), "{e}");
        // The read end was closed: writing to the pipe finds no reader.
        let e = std::fs::File::from(write).write(b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
}
