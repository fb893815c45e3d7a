//! `devinfo`: list RDMA devices and their ports, like `ibv_devinfo`, through the
//! raw `rdma_verbs_sys` bindings. It is the project's smoke test: if this prints a port
//! in `PORT_ACTIVE` with a RoCE v2 GID, the verbs stack under us works.
//!
//! ```text
//! devinfo [-d NAME] [-l] [-v]
//!   -d, --ib-dev NAME  show only device NAME (default: every device)
//!   -l, --list         print the device names only
//!   -v, --verbose      add the device limits, capability flags, port details
//!                      and the GID table
//!   -h, --help         print this help
//! ```
//!
//! Exit codes: 0 on success; 1 when there is no RDMA device, `-d` names a device
//! that does not exist, or a verb fails; 2 on a command-line error.
//!
//! Where the host kernel has no RDMA, `scripts/rxe` runs it next to a SoftRoCE
//! (rxe) device, in a VM if need be: `scripts/rxe cargo run --example devinfo -- -v`.

use std::ffi::{c_char, CStr};
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::net::Ipv6Addr;
use std::process::ExitCode;

use clap::Parser;
use rdma_verbs_sys as ffi;

/// What the command line asked for (`ibv_devinfo`'s flags).
#[derive(Parser)]
#[command(name = "devinfo", about = "RDMA devices and their ports, like ibv_devinfo")]
struct Options {
    /// Show only device NAME (default: every device).
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME")]
    device: Option<String>,
    /// Print the device names only.
    #[arg(short = 'l', long = "list")]
    list_only: bool,
    /// Add device limits, capability flags, port details and GIDs.
    #[arg(short = 'v', long)]
    verbose: bool,
}

fn main() -> ExitCode {
    // A bad flag: clap prints it with the usage and exits 2.
    let opts = Options::parse();
    match run(&opts) {
        Ok(()) | Err(Stop::PipeClosed) => ExitCode::SUCCESS,
        Err(Stop::Failed(msg)) => {
            eprintln!("devinfo: {msg}");
            ExitCode::FAILURE
        }
    }
}

const NO_DEVICE_HINT: &str = "no RDMA kernel driver is loaded, or no rxe link exists \
     (for SoftRoCE: `modprobe rdma_rxe; rdma link add rxe0 type rxe netdev <ifname>`)";

fn run(opts: &Options) -> Result<(), Stop> {
    let list = DeviceList::get()
        .map_err(|e| format!("no RDMA devices: ibv_get_device_list failed: {e}\nusual cause: {NO_DEVICE_HINT}"))?;
    if list.devices().is_empty() {
        return Err(format!("no RDMA devices found\nusual cause: {NO_DEVICE_HINT}").into());
    }

    if opts.list_only {
        let n = list.devices().len();
        let mut text = format!("{n} HCA{} found:\n", if n == 1 { "" } else { "s" });
        for &dev in list.devices() {
            let _ = writeln!(text, "\t{}", device_name(dev));
        }
        return emit(&text);
    }

    let chosen: Vec<*mut ffi::ibv_device> = match &opts.device {
        None => list.devices().to_vec(),
        Some(want) => match list.devices().iter().find(|&&d| device_name(d) == *want) {
            Some(&dev) => vec![dev],
            None => {
                let names: Vec<String> = list.devices().iter().map(|&d| device_name(d)).collect();
                return Err(format!("no RDMA device named '{want}'; available: {}", names.join(", ")).into());
            }
        },
    };

    for &dev in &chosen {
        // One device at a time: what was gathered is printed even if a later
        // device fails.
        let mut out = Report::default();
        let result = print_device(&mut out, dev, opts.verbose);
        emit(&out.0)?;
        result?;
    }
    Ok(())
}

/// A verb's failure, named by hand as `ibv_devinfo` names it: this tool calls the raw
/// bindings, whose `io::Error`s do not say which verb failed.
type Failure = Box<dyn std::error::Error>;

/// Why `run` stopped early.
enum Stop {
    /// The reader went away (`devinfo | head`): not an error, stop quietly.
    PipeClosed,
    Failed(Failure),
}

impl From<Failure> for Stop {
    fn from(e: Failure) -> Self {
        Stop::Failed(e)
    }
}

impl From<String> for Stop {
    fn from(msg: String) -> Self {
        Stop::Failed(msg.into())
    }
}

/// Writes `text` to stdout; unlike `println!`, a closed pipe does not panic.
fn emit(text: &str) -> Result<(), Stop> {
    match write_stdout(text) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(Stop::PipeClosed),
        Err(e) => Err(format!("writing to stdout: {e}").into()),
    }
}

fn write_stdout(text: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()
}

/// The array from `ibv_get_device_list`, freed on drop. The device pointers in
/// it stay valid until then.
struct DeviceList {
    raw: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> io::Result<Self> {
        let mut num = 0;
        // SAFETY: `num` is a valid out-pointer; the returned array (or NULL) is
        // owned by us until `ibv_free_device_list`.
        let raw = unsafe { ffi::ibv_get_device_list(&mut num) };
        if raw.is_null() {
            return Err(io::Error::last_os_error());
        }
        let len = usize::try_from(num).unwrap_or(0);
        Ok(Self { raw, len })
    }

    fn devices(&self) -> &[*mut ffi::ibv_device] {
        // SAFETY: `raw` is non-null and points to `len` device pointers (plus a
        // NULL terminator) that live until `self` is dropped.
        unsafe { std::slice::from_raw_parts(self.raw, self.len) }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_get_device_list` and is freed only here;
        // every context opened from it is closed before the list is dropped.
        unsafe { ffi::ibv_free_device_list(self.raw) };
    }
}

/// An open device context, closed on drop.
struct Context {
    raw: *mut ffi::ibv_context,
}

impl Context {
    fn open(dev: *mut ffi::ibv_device) -> io::Result<Self> {
        // SAFETY: `dev` is an element of a live device list.
        let raw = unsafe { ffi::ibv_open_device(dev) };
        if raw.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { raw })
    }

    fn query_device(&self) -> io::Result<ffi::ibv_device_attr> {
        let mut attr = ffi::ibv_device_attr::default();
        // SAFETY: `self.raw` is an open context and `attr` a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_device(self.raw, &mut attr) };
        verb_result(rc).map(|()| attr)
    }

    /// Through the ported inline `ibv_query_port` (the header's macro), which
    /// fills the whole current layout, `port_cap_flags2` included; the exported
    /// symbol of that name only fills the older, shorter layout.
    fn query_port(&self, port: u8) -> io::Result<ffi::ibv_port_attr> {
        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: `self.raw` is an open context and `attr` a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_port(self.raw, port, &mut attr) };
        verb_result(rc).map(|()| attr)
    }

    /// `Ok(None)` for an empty slot (`ENODATA`).
    fn query_gid(&self, port: u8, index: u32) -> io::Result<Option<ffi::ibv_gid_entry>> {
        let mut entry = ffi::ibv_gid_entry::default();
        // SAFETY: `self.raw` is an open context and `entry` a valid out-pointer;
        // flags must be 0.
        let rc = unsafe { ffi::ibv_query_gid_ex(self.raw, port.into(), index, &mut entry, 0) };
        match verb_result(rc) {
            Ok(()) => Ok(Some(entry)),
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_open_device` and is closed only here.
        let rc = unsafe { ffi::ibv_close_device(self.raw) };
        if rc != 0 {
            eprintln!("devinfo: ibv_close_device failed: {}", io::Error::last_os_error());
        }
    }
}

/// Verbs return 0 or an errno value (a few older ones -1 with `errno` set).
fn verb_result(rc: i32) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(io::Error::from_raw_os_error(rc)),
        _ => Err(io::Error::last_os_error()),
    }
}

fn device_name(dev: *mut ffi::ibv_device) -> String {
    // SAFETY: `dev` is an element of a live device list; the name it returns is
    // a NUL-terminated string inside the device, which outlives this call.
    let name = unsafe { ffi::ibv_get_device_name(dev) };
    if name.is_null() {
        return String::from("(unnamed)");
    }
    // SAFETY: non-null, NUL-terminated, alive for the duration of this borrow.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

fn print_device(out: &mut Report, dev: *mut ffi::ibv_device, verbose: bool) -> Result<(), Failure> {
    let name = device_name(dev);
    // SAFETY: `dev` is an element of a live device list; `transport_type` is a
    // plain integer field (no accessor verb exists for it).
    let transport = unsafe { (*dev).transport_type };
    let ctx = Context::open(dev).map_err(|e| format!("{name}: ibv_open_device failed: {e}"))?;
    let attr = ctx.query_device().map_err(|e| format!("{name}: ibv_query_device failed: {e}"))?;

    out.line(format_args!("hca_id:\t{name}"));
    out.field(DEV, "transport", format!("{} ({})", transport_str(transport), transport.0));
    out.field(DEV, "fw_ver", c_chars_to_string(&attr.fw_ver));
    out.field(DEV, "node_guid", guid_str(attr.node_guid));
    out.field(DEV, "sys_image_guid", guid_str(attr.sys_image_guid));
    out.field(DEV, "vendor_id", format!("0x{:04x}", attr.vendor_id));
    out.field(DEV, "vendor_part_id", attr.vendor_part_id);
    out.field(DEV, "hw_ver", format!("0x{:x}", attr.hw_ver));
    out.field(DEV, "phys_port_cnt", attr.phys_port_cnt);
    if verbose {
        print_device_limits(out, &attr);
        // SAFETY: `ctx.raw` is an open context; `num_comp_vectors` is a plain
        // integer the library set when it opened the device.
        let comp_vectors = unsafe { (*ctx.raw).num_comp_vectors };
        out.field(DEV, "num_comp_vectors", comp_vectors);
    }

    for port in 1..=attr.phys_port_cnt {
        let pattr = ctx.query_port(port).map_err(|e| format!("{name}: ibv_query_port({port}) failed: {e}"))?;
        print_port(out, &ctx, port, &pattr, verbose).map_err(|e| format!("{name}: port {port}: {e}"))?;
    }
    Ok(())
}

fn print_device_limits(out: &mut Report, a: &ffi::ibv_device_attr) {
    out.field(DEV, "max_mr_size", format!("0x{:x}", a.max_mr_size));
    out.field(DEV, "page_size_cap", format!("0x{:x}", a.page_size_cap));
    out.field(DEV, "max_qp", a.max_qp);
    out.field(DEV, "max_qp_wr", a.max_qp_wr);
    out.field(DEV, "device_cap_flags", format!("0x{:08x}", a.device_cap_flags));
    out.flags(DEV, a.device_cap_flags, &device_cap_names());
    out.field(DEV, "max_sge", a.max_sge);
    out.field(DEV, "max_sge_rd", a.max_sge_rd);
    out.field(DEV, "max_cq", a.max_cq);
    out.field(DEV, "max_cqe", a.max_cqe);
    out.field(DEV, "max_mr", a.max_mr);
    out.field(DEV, "max_pd", a.max_pd);
    out.field(DEV, "max_qp_rd_atom", a.max_qp_rd_atom);
    out.field(DEV, "max_ee_rd_atom", a.max_ee_rd_atom);
    out.field(DEV, "max_res_rd_atom", a.max_res_rd_atom);
    out.field(DEV, "max_qp_init_rd_atom", a.max_qp_init_rd_atom);
    out.field(DEV, "max_ee_init_rd_atom", a.max_ee_init_rd_atom);
    out.field(DEV, "atomic_cap", format!("{} ({})", atomic_str(a.atomic_cap), a.atomic_cap.0));
    out.field(DEV, "max_ee", a.max_ee);
    out.field(DEV, "max_rdd", a.max_rdd);
    out.field(DEV, "max_mw", a.max_mw);
    out.field(DEV, "max_raw_ipv6_qp", a.max_raw_ipv6_qp);
    out.field(DEV, "max_raw_ethy_qp", a.max_raw_ethy_qp);
    out.field(DEV, "max_mcast_grp", a.max_mcast_grp);
    out.field(DEV, "max_mcast_qp_attach", a.max_mcast_qp_attach);
    out.field(DEV, "max_total_mcast_qp_attach", a.max_total_mcast_qp_attach);
    out.field(DEV, "max_ah", a.max_ah);
    out.field(DEV, "max_fmr", a.max_fmr);
    if a.max_fmr > 0 {
        out.field(DEV, "max_map_per_fmr", a.max_map_per_fmr);
    }
    out.field(DEV, "max_srq", a.max_srq);
    if a.max_srq > 0 {
        out.field(DEV, "max_srq_wr", a.max_srq_wr);
        out.field(DEV, "max_srq_sge", a.max_srq_sge);
    }
    out.field(DEV, "max_pkeys", a.max_pkeys);
    out.field(DEV, "local_ca_ack_delay", a.local_ca_ack_delay);
}

fn print_port(out: &mut Report, ctx: &Context, port: u8, a: &ffi::ibv_port_attr, verbose: bool) -> Result<(), Failure> {
    out.line(format_args!("\t\tport:\t{port}"));
    out.field(PORT, "state", format!("{} ({})", port_state_str(a.state), a.state.0));
    out.field(PORT, "max_mtu", format!("{} ({})", mtu_str(a.max_mtu), a.max_mtu.0));
    out.field(PORT, "active_mtu", format!("{} ({})", mtu_str(a.active_mtu), a.active_mtu.0));
    out.field(PORT, "sm_lid", a.sm_lid);
    out.field(PORT, "port_lid", a.lid);
    out.field(PORT, "port_lmc", format!("0x{:02x}", a.lmc));
    out.field(PORT, "link_layer", link_layer_str(a.link_layer));
    if verbose {
        out.field(PORT, "max_msg_sz", format!("0x{:x}", a.max_msg_sz));
        out.field(PORT, "port_cap_flags", format!("0x{:08x}", a.port_cap_flags));
        out.flags(PORT, a.port_cap_flags, &port_cap_names());
        out.field(PORT, "port_cap_flags2", format!("0x{:04x}", a.port_cap_flags2));
        out.field(PORT, "max_vl_num", format!("{} ({})", vl_str(a.max_vl_num), a.max_vl_num));
        out.field(PORT, "bad_pkey_cntr", format!("0x{:x}", a.bad_pkey_cntr));
        out.field(PORT, "qkey_viol_cntr", format!("0x{:x}", a.qkey_viol_cntr));
        out.field(PORT, "sm_sl", a.sm_sl);
        out.field(PORT, "pkey_tbl_len", a.pkey_tbl_len);
        out.field(PORT, "gid_tbl_len", a.gid_tbl_len);
        out.field(PORT, "subnet_timeout", a.subnet_timeout);
        out.field(PORT, "init_type_reply", a.init_type_reply);
    }
    let lanes = width_lanes(a.active_width);
    let tenths = speed_tenths_gbps(a.active_speed);
    out.field(
        PORT,
        "active_width",
        match lanes {
            Some(n) => format!("{n}X ({})", a.active_width),
            None => format!("invalid width ({})", a.active_width),
        },
    );
    out.field(
        PORT,
        "active_speed",
        match tenths {
            Some(t) => format!("{} Gbps ({})", tenths_str(t, true), a.active_speed),
            None => format!("invalid speed ({})", a.active_speed),
        },
    );
    out.field(
        PORT,
        "rate",
        match (lanes, tenths) {
            (Some(n), Some(t)) => format!("{} Gb/s", tenths_str(n * t, false)),
            _ => String::from("unknown"),
        },
    );
    out.field(PORT, "phys_state", format!("{} ({})", phys_state_str(a.phys_state), a.phys_state));
    if verbose {
        print_gids(out, ctx, port, a)?;
    }
    out.line(format_args!(""));
    Ok(())
}

fn print_gids(out: &mut Report, ctx: &Context, port: u8, a: &ffi::ibv_port_attr) -> Result<(), Failure> {
    let len = u32::try_from(a.gid_tbl_len).unwrap_or(0);
    for index in 0..len {
        let entry = match ctx.query_gid(port, index) {
            Ok(Some(entry)) => entry,
            Ok(None) => continue,
            Err(e) => return Err(format!("_ibv_query_gid_ex(index {index}) failed: {e}").into()),
        };
        // SAFETY: both union members are plain bytes; any bit pattern is valid.
        let raw = unsafe { entry.gid.raw };
        if raw == [0; 16] {
            continue;
        }
        let mut line = format!("{}, {}", Ipv6Addr::from(raw), gid_type_str(entry.gid_type));
        if let Some(dev) = netdev_name(entry.ndev_ifindex) {
            let _ = write!(line, ", {dev}");
        }
        out.field(PORT, &format!("GID[{index:>3}]"), line);
    }
    Ok(())
}

fn netdev_name(ifindex: u32) -> Option<String> {
    if ifindex == 0 {
        return None;
    }
    let mut buf = [0 as c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes `if_indextoname` may write.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return Some(format!("ifindex {ifindex}"));
    }
    Some(c_chars_to_string(&buf))
}

/// Where a block of `name: value` lines sits: tabs before the name, and the
/// tab stop where values start (tab stops 8 columns apart, as `ibv_devinfo`).
#[derive(Clone, Copy)]
struct Section {
    indent: usize,
    value_stop: usize,
}

const DEV: Section = Section { indent: 1, value_stop: 5 };
const PORT: Section = Section { indent: 3, value_stop: 6 };

/// The text printed for one device, gathered before it is written out.
#[derive(Default)]
struct Report(String);

impl Report {
    fn line(&mut self, args: std::fmt::Arguments<'_>) {
        // Writing into a String cannot fail.
        let _ = writeln!(self.0, "{args}");
    }

    /// One `name: value` line, the value starting at the section's tab stop.
    fn field(&mut self, sec: Section, name: &str, value: impl std::fmt::Display) {
        let label = format!("{name}:");
        // The first tab after the label lands on stop `indent + 1 + len / 8`.
        let first_stop = sec.indent + 1 + label.len() / 8;
        let tabs = (sec.value_stop + 1).saturating_sub(first_stop).max(1);
        let (indent, tabs) = ("\t".repeat(sec.indent), "\t".repeat(tabs));
        self.line(format_args!("{indent}{label}{tabs}{value}"));
    }

    /// One line per set bit, under the value column; unknown bits stay visible.
    fn flags(&mut self, sec: Section, bits: u32, names: &[(u32, &str)]) {
        let pad = "\t".repeat(sec.value_stop);
        let mut known = 0;
        for &(bit, name) in names {
            if bits & bit != 0 {
                self.line(format_args!("{pad}{name}"));
                known |= bit;
            }
        }
        if bits & !known != 0 {
            self.line(format_args!("{pad}unknown bits 0x{:08x}", bits & !known));
        }
    }
}

fn device_cap_names() -> [(u32, &'static str); 23] {
    type F = ffi::ibv_device_cap_flags;
    [
        (F::IBV_DEVICE_RESIZE_MAX_WR.0, "RESIZE_MAX_WR"),
        (F::IBV_DEVICE_BAD_PKEY_CNTR.0, "BAD_PKEY_CNTR"),
        (F::IBV_DEVICE_BAD_QKEY_CNTR.0, "BAD_QKEY_CNTR"),
        (F::IBV_DEVICE_RAW_MULTI.0, "RAW_MULTI"),
        (F::IBV_DEVICE_AUTO_PATH_MIG.0, "AUTO_PATH_MIG"),
        (F::IBV_DEVICE_CHANGE_PHY_PORT.0, "CHANGE_PHY_PORT"),
        (F::IBV_DEVICE_UD_AV_PORT_ENFORCE.0, "UD_AV_PORT_ENFORCE"),
        (F::IBV_DEVICE_CURR_QP_STATE_MOD.0, "CURR_QP_STATE_MOD"),
        (F::IBV_DEVICE_SHUTDOWN_PORT.0, "SHUTDOWN_PORT"),
        (F::IBV_DEVICE_INIT_TYPE.0, "INIT_TYPE"),
        (F::IBV_DEVICE_PORT_ACTIVE_EVENT.0, "PORT_ACTIVE_EVENT"),
        (F::IBV_DEVICE_SYS_IMAGE_GUID.0, "SYS_IMAGE_GUID"),
        (F::IBV_DEVICE_RC_RNR_NAK_GEN.0, "RC_RNR_NAK_GEN"),
        (F::IBV_DEVICE_SRQ_RESIZE.0, "SRQ_RESIZE"),
        (F::IBV_DEVICE_N_NOTIFY_CQ.0, "N_NOTIFY_CQ"),
        (F::IBV_DEVICE_MEM_WINDOW.0, "MEM_WINDOW"),
        (F::IBV_DEVICE_UD_IP_CSUM.0, "UD_IP_CSUM"),
        (F::IBV_DEVICE_XRC.0, "XRC"),
        (F::IBV_DEVICE_MEM_MGT_EXTENSIONS.0, "MEM_MGT_EXTENSIONS"),
        (F::IBV_DEVICE_MEM_WINDOW_TYPE_2A.0, "MEM_WINDOW_TYPE_2A"),
        (F::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0, "MEM_WINDOW_TYPE_2B"),
        (F::IBV_DEVICE_RC_IP_CSUM.0, "RC_IP_CSUM"),
        (F::IBV_DEVICE_RAW_IP_CSUM.0, "RAW_IP_CSUM"),
    ]
}

fn port_cap_names() -> [(u32, &'static str); 24] {
    type F = ffi::ibv_port_cap_flags;
    [
        (F::IBV_PORT_SM.0, "SM"),
        (F::IBV_PORT_NOTICE_SUP.0, "NOTICE_SUP"),
        (F::IBV_PORT_TRAP_SUP.0, "TRAP_SUP"),
        (F::IBV_PORT_OPT_IPD_SUP.0, "OPT_IPD_SUP"),
        (F::IBV_PORT_AUTO_MIGR_SUP.0, "AUTO_MIGR_SUP"),
        (F::IBV_PORT_SL_MAP_SUP.0, "SL_MAP_SUP"),
        (F::IBV_PORT_MKEY_NVRAM.0, "MKEY_NVRAM"),
        (F::IBV_PORT_PKEY_NVRAM.0, "PKEY_NVRAM"),
        (F::IBV_PORT_LED_INFO_SUP.0, "LED_INFO_SUP"),
        (F::IBV_PORT_SYS_IMAGE_GUID_SUP.0, "SYS_IMAGE_GUID_SUP"),
        (F::IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP.0, "PKEY_SW_EXT_PORT_TRAP_SUP"),
        (F::IBV_PORT_EXTENDED_SPEEDS_SUP.0, "EXTENDED_SPEEDS_SUP"),
        (F::IBV_PORT_CAP_MASK2_SUP.0, "CAP_MASK2_SUP"),
        (F::IBV_PORT_CM_SUP.0, "CM_SUP"),
        (F::IBV_PORT_SNMP_TUNNEL_SUP.0, "SNMP_TUNNEL_SUP"),
        (F::IBV_PORT_REINIT_SUP.0, "REINIT_SUP"),
        (F::IBV_PORT_DEVICE_MGMT_SUP.0, "DEVICE_MGMT_SUP"),
        (F::IBV_PORT_VENDOR_CLASS_SUP.0, "VENDOR_CLASS_SUP"),
        (F::IBV_PORT_DR_NOTICE_SUP.0, "DR_NOTICE_SUP"),
        (F::IBV_PORT_CAP_MASK_NOTICE_SUP.0, "CAP_MASK_NOTICE_SUP"),
        (F::IBV_PORT_BOOT_MGMT_SUP.0, "BOOT_MGMT_SUP"),
        (F::IBV_PORT_LINK_LATENCY_SUP.0, "LINK_LATENCY_SUP"),
        (F::IBV_PORT_CLIENT_REG_SUP.0, "CLIENT_REG_SUP"),
        (F::IBV_PORT_IP_BASED_GIDS.0, "IP_BASED_GIDS"),
    ]
}

/// Up to the first NUL; the buffers are filled by the kernel or the library.
fn c_chars_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// GUIDs are stored big-endian (`__be64`); printed as four 16-bit groups.
fn guid_str(be: ffi::__be64) -> String {
    let g = u64::from_be(be);
    format!("{:04x}:{:04x}:{:04x}:{:04x}", g >> 48, (g >> 32) & 0xffff, (g >> 16) & 0xffff, g & 0xffff)
}

fn transport_str(t: ffi::ibv_transport_type) -> &'static str {
    type T = ffi::ibv_transport_type;
    match t {
        T::IBV_TRANSPORT_IB => "InfiniBand",
        T::IBV_TRANSPORT_IWARP => "iWARP",
        T::IBV_TRANSPORT_USNIC => "usNIC",
        T::IBV_TRANSPORT_USNIC_UDP => "usNIC UDP",
        T::IBV_TRANSPORT_UNSPECIFIED => "unspecified",
        _ => "unknown transport",
    }
}

fn atomic_str(a: ffi::ibv_atomic_cap) -> &'static str {
    type A = ffi::ibv_atomic_cap;
    match a {
        A::IBV_ATOMIC_NONE => "ATOMIC_NONE",
        A::IBV_ATOMIC_HCA => "ATOMIC_HCA",
        A::IBV_ATOMIC_GLOB => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    }
}

fn port_state_str(s: ffi::ibv_port_state) -> &'static str {
    type S = ffi::ibv_port_state;
    match s {
        S::IBV_PORT_NOP => "PORT_NOP",
        S::IBV_PORT_DOWN => "PORT_DOWN",
        S::IBV_PORT_INIT => "PORT_INIT",
        S::IBV_PORT_ARMED => "PORT_ARMED",
        S::IBV_PORT_ACTIVE => "PORT_ACTIVE",
        S::IBV_PORT_ACTIVE_DEFER => "PORT_ACTIVE_DEFER",
        _ => "invalid state",
    }
}

fn phys_state_str(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION_TRAINING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY_TEST",
        _ => "invalid physical state",
    }
}

fn mtu_str(m: ffi::ibv_mtu) -> String {
    // IBV_MTU_256 is 1, each step doubles.
    match m.0 {
        1..=5 => (128u32 << m.0).to_string(),
        _ => String::from("invalid MTU"),
    }
}

/// `max_vl_num` is a code: 1 means VL0 only, 2 VL0-1, 3 VL0-3, 4 VL0-7, 5 VL0-14.
fn vl_str(code: u8) -> String {
    match code {
        1..=4 => (1u32 << (code - 1)).to_string(),
        5 => String::from("15"),
        _ => String::from("invalid"),
    }
}

fn link_layer_str(l: u8) -> &'static str {
    match u32::from(l) {
        x if x == ffi::IBV_LINK_LAYER_UNSPECIFIED.0 || x == ffi::IBV_LINK_LAYER_INFINIBAND.0 => "InfiniBand",
        x if x == ffi::IBV_LINK_LAYER_ETHERNET.0 => "Ethernet",
        _ => "Unknown",
    }
}

fn gid_type_str(t: u32) -> &'static str {
    type G = ffi::ibv_gid_type;
    match ffi::ibv_gid_type(t) {
        G::IBV_GID_TYPE_IB => "IB",
        G::IBV_GID_TYPE_ROCE_V1 => "RoCE v1",
        G::IBV_GID_TYPE_ROCE_V2 => "RoCE v2",
        _ => "unknown GID type",
    }
}

/// Lanes of an `active_width` code.
fn width_lanes(w: u8) -> Option<u32> {
    match w {
        1 => Some(1),
        2 => Some(4),
        4 => Some(8),
        8 => Some(12),
        16 => Some(2),
        _ => None,
    }
}

/// Per-lane rate of an `active_speed` code, in tenths of Gb/s (no floats).
/// rdma-core 44's `ibv_port_attr` has no `active_speed_ex`, so XDR and later
/// speeds cannot be reported through it.
fn speed_tenths_gbps(s: u8) -> Option<u32> {
    match s {
        1 => Some(25),
        2 => Some(50),
        4 | 8 => Some(100),
        16 => Some(140),
        32 => Some(250),
        64 => Some(500),
        128 => Some(1000),
        _ => None,
    }
}

/// `25` -> "2.5"; `100` -> "10.0" with `keep_decimal`, else "10".
fn tenths_str(t: u32, keep_decimal: bool) -> String {
    if t % 10 == 0 && !keep_decimal {
        (t / 10).to_string()
    } else {
        format!("{}.{}", t / 10, t % 10)
    }
}
