//! Test bed: the device from the environment, RAII holders for verbs objects, RC
//! connection setup and bounded completion polling. Destructors check that each
//! object was destroyed, so a test also proves its teardown.

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, null_mut};
use std::time::{Duration, Instant};

use rdma_verbs_sys::*;

/// How long any wait for a completion or event may take before the test fails.
/// Generous: the tests run under emulation, where rxe is 10-30x slower.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Port used on the device (rxe has one).
pub const PORT: u8 = 1;

/// Panics with the verb's name and `errno` when `ok` is false.
#[track_caller]
pub fn check(ok: bool, verb: &str) {
    if !ok {
        panic!("{verb} failed: {}", std::io::Error::last_os_error());
    }
}

/// Panics with the verb's name and the returned error code when `rc` is not 0.
#[track_caller]
pub fn check_rc(rc: c_int, verb: &str) {
    assert_eq!(rc, 0, "{verb} failed: {}", std::io::Error::from_raw_os_error(rc.abs()));
}

/// An open device context on the device named by `RDMA_DEVICE` (else the first one),
/// with the GID at `RDMA_GID_INDEX` (else 1).
pub struct Device {
    pub ctx: *mut ibv_context,
    pub name: String,
    pub gid_index: u8,
    pub gid: ibv_gid,
    pub port_attr: ibv_port_attr,
}

impl Device {
    /// Opens the device, or panics: these tests must fail, not pass, without one.
    pub fn open() -> Device {
        let wanted = std::env::var("RDMA_DEVICE").ok().filter(|s| !s.is_empty());
        let gid_index: u8 = match std::env::var("RDMA_GID_INDEX") {
            Ok(s) if !s.is_empty() => s.parse().expect("RDMA_GID_INDEX must be a number"),
            _ => 1,
        };
        const NO_DEVICE: &str = "no RDMA device found: these tests need one (scripts/test runs them on an rxe \
                                 device; by hand: scripts/rxe cargo test -p rdma-sys --test device -- \
                                 --include-ignored --test-threads=1)";
        let mut num = 0;
        // SAFETY: `num` is a valid out-pointer; the list is freed below.
        let list = unsafe { ibv_get_device_list(&mut num) };
        if list.is_null() {
            // Without any RDMA support in the kernel, the list itself fails (ENOSYS).
            panic!("{NO_DEVICE}; ibv_get_device_list: {}", std::io::Error::last_os_error());
        }
        let mut names = Vec::new();
        let mut chosen = None;
        for i in 0..usize::try_from(num).unwrap() {
            // SAFETY: the list holds `num` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a listed device has a NUL-terminated name that lives with the list.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            if chosen.is_none() && wanted.as_deref().is_none_or(|w| w == name) {
                chosen = Some((dev, name.clone()));
            }
            names.push(name);
        }
        let Some((dev, name)) = chosen else {
            // SAFETY: the list came from ibv_get_device_list and is freed once.
            unsafe { ibv_free_device_list(list) };
            match wanted {
                Some(w) => panic!("RDMA_DEVICE={w} is not among the RDMA devices {names:?}"),
                None => panic!("{NO_DEVICE}"),
            }
        };
        // SAFETY: `dev` comes from the live list.
        let ctx = unsafe { ibv_open_device(dev) };
        // SAFETY: an open context keeps its device; the list itself can go.
        unsafe { ibv_free_device_list(list) };
        check(!ctx.is_null(), "ibv_open_device");
        eprintln!("device test on {name} (port {PORT}, GID index {gid_index})");

        let mut port_attr = ibv_port_attr::default();
        // SAFETY: `ctx` is open and `port_attr` is a writable ibv_port_attr.
        check_rc(unsafe { ibv_query_port(ctx, PORT, &mut port_attr) }, "ibv_query_port");
        let mut gid = ibv_gid::default();
        // SAFETY: `ctx` is open and `gid` writable.
        let rc = unsafe { ibv_query_gid(ctx, PORT, c_int::from(gid_index), &mut gid) };
        check_rc(rc, "ibv_query_gid");
        Device { ctx, name, gid_index, gid, port_attr }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the context is open, and every object on it was dropped before it
        // (tests declare the device first, so it drops last).
        let rc = unsafe { ibv_close_device(self.ctx) };
        if rc != 0 && !std::thread::panicking() {
            panic!("ibv_close_device failed: {rc}");
        }
    }
}

/// Destroys a verbs object on drop and checks the result (unless already panicking).
macro_rules! holder {
    ($name:ident, $raw:ty, $destroy:ident) => {
        pub struct $name(pub *mut $raw);

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the object is live and owned by this holder; whatever depends
                // on it was declared later in the test and dropped first.
                let rc = unsafe { $destroy(self.0) };
                if rc != 0 && !std::thread::panicking() {
                    panic!(concat!(stringify!($destroy), " failed: {}"), std::io::Error::from_raw_os_error(rc));
                }
            }
        }
    };
}

holder!(Pd, ibv_pd, ibv_dealloc_pd);
holder!(Cq, ibv_cq, ibv_destroy_cq);
holder!(Qp, ibv_qp, ibv_destroy_qp);
holder!(Srq, ibv_srq, ibv_destroy_srq);
holder!(Mw, ibv_mw, ibv_dealloc_mw);
holder!(Channel, ibv_comp_channel, ibv_destroy_comp_channel);

impl Pd {
    pub fn new(dev: &Device) -> Pd {
        // SAFETY: the context is open.
        let pd = unsafe { ibv_alloc_pd(dev.ctx) };
        check(!pd.is_null(), "ibv_alloc_pd");
        Pd(pd)
    }
}

impl Cq {
    /// A plain CQ of `cqe` entries, optionally on a completion channel.
    pub fn new(dev: &Device, cqe: c_int, channel: *mut ibv_comp_channel) -> Cq {
        // SAFETY: the context is open; `channel` is null or live on it.
        let cq = unsafe { ibv_create_cq(dev.ctx, cqe, null_mut(), channel, 0) };
        check(!cq.is_null(), "ibv_create_cq");
        Cq(cq)
    }
}

/// An extended CQ, created with the ported `ibv_create_cq_ex`.
pub struct CqEx(pub *mut ibv_cq_ex);

impl CqEx {
    pub fn new(dev: &Device, cqe: u32, wc_flags: u64) -> CqEx {
        let mut attr = ibv_cq_init_attr_ex { cqe, wc_flags, ..Default::default() };
        // SAFETY: the context is open and `attr` a valid, writable attribute struct.
        let cq = unsafe { ibv_create_cq_ex(dev.ctx, &mut attr) };
        check(!cq.is_null(), "ibv_create_cq_ex");
        CqEx(cq)
    }

    /// The same CQ as a plain `ibv_cq`, through the ported `ibv_cq_ex_to_cq`.
    pub fn cq(&self) -> *mut ibv_cq {
        ibv_cq_ex_to_cq(self.0)
    }
}

impl Drop for CqEx {
    fn drop(&mut self) {
        // SAFETY: the CQ is live and owned here; its QPs were dropped first.
        let rc = unsafe { ibv_destroy_cq(self.cq()) };
        if rc != 0 && !std::thread::panicking() {
            panic!("ibv_destroy_cq (extended CQ) failed: {rc}");
        }
    }
}

/// A registered, 8-byte-aligned buffer (atomics need the alignment).
pub struct Mr {
    buf: Box<[u64]>,
    pub mr: *mut ibv_mr,
}

/// Access for buffers the peer reads, writes and updates atomically.
pub fn full_access() -> c_int {
    let flags = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
    flags.0 as c_int
}

impl Mr {
    pub fn new(pd: &Pd, len: usize, access: c_int) -> Mr {
        let mut buf = vec![0u64; len.div_ceil(8)].into_boxed_slice();
        // SAFETY: the PD is live; the buffer is owned by the returned Mr and outlives the
        // registration (Drop deregisters before the Box is freed).
        let mr = unsafe { ibv_reg_mr(pd.0, buf.as_mut_ptr().cast::<c_void>(), len, access) };
        check(!mr.is_null(), "ibv_reg_mr");
        Mr { buf, mr }
    }

    pub fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        // SAFETY: the MR is live.
        unsafe { (*self.mr).length }
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is live.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: the MR is live.
        unsafe { (*self.mr).rkey }
    }

    /// The registered bytes. Read them only when no operation on them is in flight
    /// (after its completion was polled).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the Box holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<u8>(), self.len()) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY: as in `bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast::<u8>(), len) }
    }

    /// The 8-byte word at `index`, read through the pointer the device writes to.
    pub fn word(&self, index: usize) -> u64 {
        assert!(index < self.buf.len());
        // SAFETY: in bounds and aligned; a volatile read, since the device wrote it.
        unsafe { ptr::read_volatile(self.buf.as_ptr().add(index)) }
    }

    pub fn set_word(&mut self, index: usize, value: u64) {
        self.buf[index] = value;
    }

    /// A scatter/gather entry over `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> ibv_sge {
        assert!(offset + len <= self.len());
        ibv_sge { addr: self.addr() + offset as u64, length: u32::try_from(len).unwrap(), lkey: self.lkey() }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR is live, and no QP that could still access it is left (QPs are
        // declared after MRs, so they drop first).
        let rc = unsafe { ibv_dereg_mr(self.mr) };
        if rc != 0 && !std::thread::panicking() {
            panic!("ibv_dereg_mr failed: {rc}");
        }
    }
}

/// Default capacities for the test QPs.
pub fn qp_cap() -> ibv_qp_cap {
    ibv_qp_cap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

impl Qp {
    /// An RC QP made with the classic `ibv_create_qp`.
    pub fn rc(pd: &Pd, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, srq: *mut ibv_srq) -> Qp {
        let mut attr = ibv_qp_init_attr {
            send_cq,
            recv_cq,
            srq,
            cap: qp_cap(),
            qp_type: ibv_qp_type::IBV_QPT_RC,
            ..Default::default()
        };
        if !srq.is_null() {
            attr.cap.max_recv_wr = 0;
            attr.cap.max_recv_sge = 0;
        }
        // SAFETY: the PD and CQs (and SRQ, if any) are live; `attr` is valid.
        let qp = unsafe { ibv_create_qp(pd.0, &mut attr) };
        check(!qp.is_null(), "ibv_create_qp");
        Qp(qp)
    }

    /// An RC QP made with the ported `ibv_create_qp_ex`, with the `ibv_wr_*` ops in
    /// `send_ops_flags`.
    pub fn rc_ex(dev: &Device, pd: &Pd, send_cq: *mut ibv_cq, recv_cq: *mut ibv_cq, send_ops_flags: u64) -> Qp {
        let mask = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        let mut attr = ibv_qp_init_attr_ex {
            send_cq,
            recv_cq,
            cap: qp_cap(),
            qp_type: ibv_qp_type::IBV_QPT_RC,
            comp_mask: mask.0,
            pd: pd.0,
            send_ops_flags,
            ..Default::default()
        };
        // SAFETY: the context, PD and CQs are live; `attr` is valid and writable.
        let qp = unsafe { ibv_create_qp_ex(dev.ctx, &mut attr) };
        check(!qp.is_null(), "ibv_create_qp_ex");
        Qp(qp)
    }

    pub fn num(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.0).qp_num }
    }

    /// Moves the QP through INIT, RTR and RTS, connected to the QP numbered `remote_qpn`
    /// on this same device, addressed through the GID at `RDMA_GID_INDEX`.
    pub fn connect(&self, dev: &Device, remote_qpn: u32) {
        use ibv_qp_attr_mask as m;
        let access = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        let mut init = ibv_qp_attr {
            qp_state: ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qp_access_flags: access.0,
            ..Default::default()
        };
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut init, mask, "ibv_modify_qp(INIT)");

        let mut rtr = ibv_qp_attr {
            qp_state: ibv_qp_state::IBV_QPS_RTR,
            path_mtu: dev.port_attr.active_mtu,
            dest_qp_num: remote_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.port_num = PORT;
        rtr.ah_attr.grh.dgid = dev.gid;
        rtr.ah_attr.grh.sgid_index = dev.gid_index;
        rtr.ah_attr.grh.hop_limit = 64;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut rtr, mask, "ibv_modify_qp(RTR)");

        let mut rts = ibv_qp_attr {
            qp_state: ibv_qp_state::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: 0,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut rts, mask, "ibv_modify_qp(RTS)");
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask, what: &str) {
        // SAFETY: the QP is live and `attr` valid for the bits in `mask`.
        check_rc(unsafe { ibv_modify_qp(self.0, attr, mask.0 as c_int) }, what);
    }
}

/// Connects two QPs on the same device to each other.
pub fn connect_pair(dev: &Device, a: &Qp, b: &Qp) {
    a.connect(dev, b.num());
    b.connect(dev, a.num());
}

/// Posts one receive of `sge` on `qp` with the ported `ibv_post_recv`.
pub fn post_recv(qp: &Qp, wr_id: u64, mut sge: ibv_sge) {
    let mut wr = ibv_recv_wr { wr_id, next: null_mut(), sg_list: &mut sge, num_sge: 1 };
    let mut bad = null_mut();
    // SAFETY: the QP is live; `wr` and `sge` live through the call (the provider copies
    // them) and the buffer is registered and outlives the receive.
    let rc = unsafe { ibv_post_recv(qp.0, &mut wr, &mut bad) };
    check_rc(rc, "ibv_post_recv");
    assert!(bad.is_null(), "ibv_post_recv set bad_wr on success");
}

/// Polls `cq` with the ported `ibv_poll_cq` until `n` completions arrived; panics
/// after [`TIMEOUT`] or on a poll error.
pub fn poll(cq: *mut ibv_cq, n: usize) -> Vec<ibv_wc> {
    let mut out = Vec::with_capacity(n);
    let start = Instant::now();
    while out.len() < n {
        let mut wc = [ibv_wc::default(); 4];
        let want = (n - out.len()).min(wc.len()) as c_int;
        // SAFETY: the CQ is live and `wc` has room for `want` entries.
        let got = unsafe { ibv_poll_cq(cq, want, wc.as_mut_ptr()) };
        assert!(got >= 0, "ibv_poll_cq failed: {got}");
        assert!(got <= want, "ibv_poll_cq returned {got} completions for room for {want}");
        out.extend_from_slice(&wc[..got as usize]);
        if got == 0 {
            assert!(
                start.elapsed() < TIMEOUT,
                "timed out after {TIMEOUT:?} waiting for {n} completions (got {})",
                out.len()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

/// Polls one completion and checks its status, opcode and work request id.
#[track_caller]
pub fn expect_one(cq: *mut ibv_cq, wr_id: u64, opcode: ibv_wc_opcode) -> ibv_wc {
    let wc = poll(cq, 1)[0];
    expect_wc(&wc, wr_id, opcode);
    wc
}

#[track_caller]
pub fn expect_wc(wc: &ibv_wc, wr_id: u64, opcode: ibv_wc_opcode) {
    assert_eq!(
        wc.status.0,
        ibv_wc_status::IBV_WC_SUCCESS.0,
        "completion of wr_id {} failed: status {} ({:?}), vendor_err {:#x}",
        wc.wr_id,
        wc.status.0,
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        unsafe { CStr::from_ptr(ibv_wc_status_str(wc.status)) },
        wc.vendor_err
    );
    assert_eq!(wc.wr_id, wr_id, "completion for an unexpected work request");
    assert_eq!(wc.opcode.0, opcode.0, "unexpected completion opcode");
}

/// Checks that `cq` stays empty for `wait`.
pub fn expect_empty(cq: *mut ibv_cq, wait: Duration) {
    let start = Instant::now();
    while start.elapsed() < wait {
        let mut wc = ibv_wc::default();
        // SAFETY: the CQ is live and `wc` has room for one entry.
        let got = unsafe { ibv_poll_cq(cq, 1, &mut wc) };
        assert_eq!(got, 0, "expected no completion, got one with wr_id {}", wc.wr_id);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A byte pattern that differs per position and per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The kernel's resource counts (PD, CQ, QP, MR, SRQ, contexts, CM ids) of every RDMA
/// device, from `rdma -j resource show`: device name -> (counter, value), sorted.
pub fn resource_counts() -> Vec<(String, Vec<(String, u64)>)> {
    let out = std::process::Command::new("rdma")
        .args(["-j", "resource", "show"])
        .output()
        .expect("run `rdma -j resource show` (iproute2)");
    assert!(out.status.success(), "rdma resource show failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // One flat JSON object per device: {"ifindex":0,"ifname":"rxe0","pd":0,"cq":0,...}
    let mut devices: Vec<(String, Vec<(String, u64)>)> = text
        .split('{')
        .skip(1)
        .filter_map(|obj| {
            let obj = obj.split('}').next().unwrap_or("");
            let mut name = None;
            let mut counts = Vec::new();
            for pair in obj.split(',') {
                let (k, v) = pair.split_once(':')?;
                let (k, v) = (k.trim().trim_matches('"'), v.trim().trim_matches('"'));
                match k {
                    "ifname" => name = Some(v.to_owned()),
                    "ifindex" => {}
                    _ => counts.push((k.to_owned(), v.parse().ok()?)),
                }
            }
            counts.sort();
            Some((name?, counts))
        })
        .collect();
    devices.sort();
    assert!(!devices.is_empty(), "no device in `rdma resource show`: {text}");
    devices
}

/// Asserts when dropped that every device's resource counts are back to where they were
/// when it was made: the test freed everything it created. Tests run one at a time
/// (`--test-threads=1`), so the counts are this test's own.
pub struct LeakCheck(Vec<(String, Vec<(String, u64)>)>);

impl LeakCheck {
    #[must_use]
    #[allow(clippy::new_without_default)] // taking a snapshot is not a default value
    pub fn new() -> LeakCheck {
        LeakCheck(resource_counts())
    }
}

impl Drop for LeakCheck {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        assert_eq!(resource_counts(), self.0, "device resources leaked (after vs before the test)");
    }
}
