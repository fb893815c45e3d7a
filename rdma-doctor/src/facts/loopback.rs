//! The data-plane check: two RC QPs on one device, connected to each other through the
//! port, pass an RDMA WRITE, an RDMA READ and a SEND with the bytes verified, then a
//! FETCH_ADD and a CMP_SWAP. Every wait is bounded.
//!
//! On iWARP the two QPs cannot be connected by hand (an iWARP QP reaches RTS only with
//! the TCP stream of a connection under it): they are connected through rdma_cm over TCP
//! on an IPv4 address of the device's netdev, the listener's side taking the client's
//! request in this thread while the client connects in another. The READ's sink is
//! registered for remote write: an iWARP READ response is a tagged write into it, which
//! iWARP hardware checks (siw does not).
//!
//! The safe posting API is not used here on purpose: this module depends only on the
//! object types, and posts with `ibv_post_send` / `ibv_post_recv` in small unsafe blocks.
//! The rule those blocks keep: a buffer the device may touch lives in a [`MemoryRegion`]
//! that outlives the work request, and no Rust reference to bytes the device writes is
//! taken until the completion arrived. When a wait times out, the QPs are destroyed
//! before the regions (field order of `Bed`), so the device is done with the memory
//! before it is freed.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use rdma_verbs::{
    ffi, AccessFlags, AlignedBuf, CmId, CompletionQueue, ConnParam, Context, EventChannel, InitAttr, Local,
    MemoryRegion, PortSpace, ProtectionDomain, QpAccess, QpType, QueuePair, QueuePairBuilder, RemoteWritable, Result,
    WcOpcode, WorkCompletion,
};

/// Bytes moved by each of WRITE, READ and SEND.
pub(crate) const LEN: usize = 1024;
/// Offset of the atomic word in the target region (8-byte aligned).
pub(crate) const ATOMIC_AT: usize = 3 * LEN;
pub(crate) const FIRST_VALUE: u64 = 0x0102_0304_0506_0700;
pub(crate) const ADD: u64 = 0x11;
pub(crate) const SWAP: u64 = 0x00c0_ffee_0000_0042;

/// How the detail of an operation the device does not support begins (its `ok` is true:
/// nothing failed).
pub(crate) const SKIPPED: &str = "skipped";

/// What the loopback test did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopbackReport {
    /// Setting up (PD, CQs, QPs, regions, connecting): `None` when it worked, else why not.
    /// A failure here is the control plane's.
    pub setup_error: Option<String>,
    /// Each operation, in order; the test stops at the first that fails.
    pub ops: Vec<OpResult>,
    /// Milliseconds the whole test took.
    pub elapsed_ms: u64,
}

/// One operation of the loopback test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpResult {
    /// `RDMA_WRITE`, `RDMA_READ`, `SEND`, `FETCH_ADD`, `CMP_SWAP`.
    pub op: String,
    /// Completed successfully and the data checked out.
    pub ok: bool,
    /// What was verified, or what went wrong.
    pub detail: String,
}

impl LoopbackReport {
    /// Setup worked and every operation passed.
    pub fn passed(&self) -> bool {
        self.setup_error.is_none() && !self.ops.is_empty() && self.ops.iter().all(|o| o.ok)
    }
}

/// Runs the loopback test on `port` of `ctx`, waiting at most `timeout` for each
/// completion. With `over` (iWARP), the QPs connect through rdma_cm on that address (the
/// device's netdev's), the QPs and regions on librdmacm's context of the same device.
pub fn run(ctx: &Context, port: u8, timeout: Duration, over: Option<Ipv4Addr>) -> LoopbackReport {
    let start = Instant::now();
    let mut report = LoopbackReport::default();
    let bed = match over {
        None => Bed::new(ctx, port).map_err(|e| e.to_string()),
        Some(ip) => Bed::over_rdma_cm(ip, timeout),
    };
    match bed {
        Err(e) => report.setup_error = Some(e),
        Ok(mut bed) => {
            let atomics = ctx.query_device().map(|d| d.atomic_cap.supported()).unwrap_or(false);
            // (name, the operation, whether it is an atomic)
            let steps: [(&str, Step, bool); 5] = [
                ("RDMA_WRITE", Bed::write, false),
                ("RDMA_READ", Bed::read, false),
                ("SEND", Bed::send, false),
                ("FETCH_ADD", Bed::fetch_add, true),
                ("CMP_SWAP", Bed::cmp_swap, true),
            ];
            for (op, step, atomic) in steps {
                if atomic && !atomics {
                    let detail = format!("{SKIPPED}: the device reports no atomic support (atomic_cap NONE)");
                    report.ops.push(OpResult { op: op.into(), ok: true, detail });
                    continue;
                }
                let result = step(&mut bed, timeout);
                let ok = result.is_ok();
                let detail = result.unwrap_or_else(|e| e);
                report.ops.push(OpResult { op: op.into(), ok, detail });
                if !ok {
                    break;
                }
            }
        }
    }
    report.elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    report
}

type Step = fn(&mut Bed, Duration) -> std::result::Result<String, String>;

/// The test bed. Fields drop in order: the QPs first (the device stops touching memory),
/// then the CQs, then the regions.
struct Bed {
    a: QueuePair,
    b: QueuePair,
    cq_a: CompletionQueue,
    cq_b: CompletionQueue,
    /// Source of WRITE and SEND (a's side).
    src: MemoryRegion<AlignedBuf, Local>,
    /// Target of WRITE and the atomics, source of READ (b's side).
    target: MemoryRegion<AlignedBuf, RemoteWritable>,
    /// READ destination and atomic results (a's side); remote-writable for iWARP's READ
    /// response (see the module's docs).
    sink: MemoryRegion<AlignedBuf, RemoteWritable>,
    /// The receive buffer of SEND (b's side).
    recv: MemoryRegion<AlignedBuf, Local>,
}

impl Bed {
    /// The bed around two QPs made on `pd` with `cq_a` and `cq_b` (not yet connected).
    fn around(
        pd: &ProtectionDomain,
        (a, cq_a): (QueuePair, CompletionQueue),
        (b, cq_b): (QueuePair, CompletionQueue),
    ) -> Result<Bed> {
        let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        Ok(Bed {
            src: pd.register(AlignedBuf::new(4 * LEN)?, AccessFlags::LOCAL_WRITE)?,
            target: pd.register_remote_writable(AlignedBuf::new(4 * LEN)?, remote)?,
            sink: pd.register_remote_writable(AlignedBuf::new(4 * LEN)?, AccessFlags::REMOTE_WRITE)?,
            recv: pd.register(AlignedBuf::new(4 * LEN)?, AccessFlags::LOCAL_WRITE)?,
            a,
            b,
            cq_a,
            cq_b,
        })
    }

    fn qp_builder<'a>(pd: &'a ProtectionDomain, cq: &'a CompletionQueue) -> QueuePairBuilder<'a> {
        QueuePair::builder(pd, QpType::Rc, cq, cq).max_send_wr(8).max_recv_wr(8)
    }

    fn new(ctx: &Context, port: u8) -> Result<Bed> {
        let pd = ProtectionDomain::new(ctx)?;
        let (cq_a, cq_b) = (CompletionQueue::new(ctx, 16)?, CompletionQueue::new(ctx, 16)?);
        let a = Bed::qp_builder(&pd, &cq_a).build()?;
        let b = Bed::qp_builder(&pd, &cq_b).build()?;
        let bed = Bed::around(&pd, (a, cq_a), (b, cq_b))?;
        let (ia, ib) = (bed.a.local_info(port)?, bed.b.local_info(port)?);
        let init = InitAttr {
            port,
            access: QpAccess::REMOTE_WRITE | QpAccess::REMOTE_READ | QpAccess::REMOTE_ATOMIC,
            ..InitAttr::default()
        };
        bed.a.connect(&init, &ib)?;
        bed.b.connect(&init, &ia)?;
        Ok(bed)
    }

    /// iWARP: `a` is a client's QP, `b` the QP of the request it makes to a listener on
    /// `ip` (a free port), connected through rdma_cm. Both ids sit on librdmacm's one
    /// context of the device, so one PD serves both QPs and the regions. Each QP holds
    /// its id, and the id its channel, until the QP is gone.
    fn over_rdma_cm(ip: Ipv4Addr, timeout: Duration) -> std::result::Result<Bed, String> {
        let at = |what: &'static str| move |e: rdma_verbs::Error| format!("{what} (rdma_cm over TCP, iWARP): {e}");
        let channel = || EventChannel::new().map_err(at("opening /dev/infiniband/rdma_cm (rdma_create_event_channel)"));
        let (server_channel, client_channel) = (channel()?, channel()?);
        let listener = CmId::new(&server_channel, PortSpace::Tcp).map_err(at("rdma_create_id"))?;
        listener.bind(SocketAddr::new(ip.into(), 0)).map_err(at("binding the listener (rdma_bind_addr)"))?;
        listener.listen(1).map_err(at("rdma_listen"))?;
        let addr = listener.local_addr().ok_or("the bound listener has no local address")?;
        let client = CmId::new(&client_channel, PortSpace::Tcp).map_err(at("rdma_create_id"))?;
        client.resolve_addr(None, addr, timeout).map_err(at("rdma_resolve_addr"))?;
        client.resolve_route(timeout).map_err(at("rdma_resolve_route"))?;
        let ctx = client.context().map_err(at("the id's device context"))?;
        let pd = ProtectionDomain::new(&ctx).map_err(at("ibv_alloc_pd"))?;
        let cq = || CompletionQueue::new(&ctx, 16).map_err(at("ibv_create_cq"));
        let (cq_a, cq_b) = (cq()?, cq()?);
        let a = client.create_qp(Bed::qp_builder(&pd, &cq_a)).map_err(at("rdma_create_qp"))?;
        let b = std::thread::scope(|s| {
            // The client waits for the connection to be established while this thread
            // takes its request, makes b's QP on it and accepts.
            let connecting =
                s.spawn(|| client.connect(&ConnParam::new(), timeout).map(drop).map_err(at("rdma_connect")));
            let accepted = (|| {
                let id = listener.get_request(timeout).map_err(at("waiting for the connection request"))?.into_id();
                let b = id.create_qp(Bed::qp_builder(&pd, &cq_b)).map_err(at("rdma_create_qp"))?;
                id.accept(&ConnParam::new(), timeout).map_err(at("rdma_accept"))?;
                Ok::<_, String>(b)
            })();
            let connected = connecting.join().unwrap_or_else(|_| Err("the connecting thread panicked".into()));
            // The client's error first: a listener that saw no request is its consequence.
            connected.and(accepted)
        })?;
        Bed::around(&pd, (a, cq_a), (b, cq_b)).map_err(|e| e.to_string())
    }

    fn write(&mut self, timeout: Duration) -> std::result::Result<String, String> {
        let msg = pattern(LEN, 1);
        self.src.as_mut_slice()[..LEN].copy_from_slice(&msg);
        let remote = self.target.addr();
        self.post_rdma(ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0, remote)?;
        expect(wait(&mut self.cq_a, timeout, "RDMA WRITE")?, WcOpcode::RdmaWrite)?;
        let mut got = vec![0u8; LEN];
        self.target.read_at(0, &mut got).map_err(|e| e.to_string())?;
        same(&got, &msg, "the WRITE target")?;
        Ok(format!("{LEN} bytes written to the peer's region and verified there"))
    }

    fn read(&mut self, timeout: Duration) -> std::result::Result<String, String> {
        let msg = pattern(LEN, 2);
        self.target.write_at(LEN, &msg).map_err(|e| e.to_string())?;
        let remote = self.target.addr() + LEN as u64;
        self.post_rdma(ffi::ibv_wr_opcode::IBV_WR_RDMA_READ, 0, remote)?;
        expect(wait(&mut self.cq_a, timeout, "RDMA READ")?, WcOpcode::RdmaRead)?;
        // The READ completed: the device is done writing `sink`.
        let mut got = vec![0u8; LEN];
        self.sink.read_at(0, &mut got).map_err(|e| e.to_string())?;
        same(&got, &msg, "the READ result")?;
        Ok(format!("{LEN} bytes read from the peer's region and verified"))
    }

    fn send(&mut self, timeout: Duration) -> std::result::Result<String, String> {
        let msg = pattern(LEN, 3);
        self.src.as_mut_slice()[LEN..2 * LEN].copy_from_slice(&msg);
        let mut rsge = self.recv.sge(..LEN).map_err(|e| e.to_string())?;
        let mut rwr = ffi::ibv_recv_wr { wr_id: 30, next: std::ptr::null_mut(), sg_list: &mut rsge, num_sge: 1 };
        let mut bad = std::ptr::null_mut();
        // SAFETY: b is live; the WR and SGE outlive the call; `recv` is registered and
        // outlives the receive (a timeout destroys the QPs before the regions), and no
        // Rust reference to it is taken before its completion.
        let rc = unsafe { ffi::ibv_post_recv(self.b.as_raw(), &mut rwr, &mut bad) };
        if rc != 0 {
            return Err(format!("ibv_post_recv failed: {}", std::io::Error::from_raw_os_error(rc)));
        }
        let mut sge = self.src.sge(LEN..2 * LEN).map_err(|e| e.to_string())?;
        self.post(ffi::ibv_wr_opcode::IBV_WR_SEND, &mut sge, ffi::ibv_send_wr__bindgen_ty_2::default())?;
        expect(wait(&mut self.cq_a, timeout, "SEND")?, WcOpcode::Send)?;
        let wc = expect(wait(&mut self.cq_b, timeout, "the receive of the SEND")?, WcOpcode::Recv)?;
        if wc.byte_len() as usize != LEN {
            return Err(format!("the receive completed with {} bytes, {LEN} were sent", wc.byte_len()));
        }
        same(&self.recv.as_slice()[..LEN], &msg, "the received message")?;
        Ok(format!("{LEN}-byte message received and verified"))
    }

    fn fetch_add(&mut self, timeout: Duration) -> std::result::Result<String, String> {
        let word = self.target.atomic_u64(ATOMIC_AT).map_err(|e| e.to_string())?;
        word.store(FIRST_VALUE, std::sync::atomic::Ordering::Relaxed);
        let old = self.atomic(ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, ADD, 0, timeout)?;
        let now =
            self.target.atomic_u64(ATOMIC_AT).map_err(|e| e.to_string())?.load(std::sync::atomic::Ordering::Relaxed);
        let order = returned_order(old, FIRST_VALUE)?;
        let expected = [FIRST_VALUE.wrapping_add(ADD), (FIRST_VALUE.swap_bytes().wrapping_add(ADD)).swap_bytes()];
        if !expected.contains(&now) {
            return Err(format!("after FETCH_ADD({ADD:#x}) the word is {now:#x}, expected {:#x}", expected[0]));
        }
        Ok(format!("returned the old value {FIRST_VALUE:#x} ({order}) and added {ADD:#x}"))
    }

    fn cmp_swap(&mut self, timeout: Duration) -> std::result::Result<String, String> {
        let current =
            self.target.atomic_u64(ATOMIC_AT).map_err(|e| e.to_string())?.load(std::sync::atomic::Ordering::Relaxed);
        let old = self.atomic(ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, current, SWAP, timeout)?;
        let order = returned_order(old, current)?;
        let now =
            self.target.atomic_u64(ATOMIC_AT).map_err(|e| e.to_string())?.load(std::sync::atomic::Ordering::Relaxed);
        if now != SWAP && now != SWAP.swap_bytes() {
            return Err(format!("after CMP_SWAP the word is {now:#x}, expected {SWAP:#x}"));
        }
        Ok(format!("compared {current:#x} ({order}) and swapped in {SWAP:#x}"))
    }

    /// Posts a signaled RDMA WRITE (from `src`) or READ (into `sink`) of LEN bytes.
    fn post_rdma(
        &mut self,
        opcode: ffi::ibv_wr_opcode,
        offset: usize,
        remote_addr: u64,
    ) -> std::result::Result<(), String> {
        let range = offset..offset + LEN;
        let sge =
            if opcode == ffi::ibv_wr_opcode::IBV_WR_RDMA_READ { self.sink.sge(range) } else { self.src.sge(range) };
        let mut sge = sge.map_err(|e| e.to_string())?;
        let rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey: self.target.rkey() };
        self.post(opcode, &mut sge, ffi::ibv_send_wr__bindgen_ty_2 { rdma })
    }

    /// Runs one atomic on the target word and returns the 8 bytes that came back.
    fn atomic(
        &mut self,
        opcode: ffi::ibv_wr_opcode,
        compare_add: u64,
        swap: u64,
        timeout: Duration,
    ) -> std::result::Result<u64, String> {
        let mut sge = self.sink.sge(2 * LEN..2 * LEN + 8).map_err(|e| e.to_string())?;
        let atomic = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: self.target.addr() + ATOMIC_AT as u64,
            compare_add,
            swap,
            rkey: self.target.rkey(),
        };
        self.post(opcode, &mut sge, ffi::ibv_send_wr__bindgen_ty_2 { atomic })?;
        let want = if opcode == ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD {
            WcOpcode::FetchAdd
        } else {
            WcOpcode::CompSwap
        };
        expect(wait(&mut self.cq_a, timeout, "the atomic")?, want)?;
        let mut b = [0u8; 8];
        self.sink.read_at(2 * LEN, &mut b).map_err(|e| e.to_string())?;
        Ok(u64::from_ne_bytes(b))
    }

    fn post(
        &mut self,
        opcode: ffi::ibv_wr_opcode,
        sge: &mut ffi::ibv_sge,
        wr: ffi::ibv_send_wr__bindgen_ty_2,
    ) -> std::result::Result<(), String> {
        let mut swr = ffi::ibv_send_wr {
            wr_id: u64::from(opcode.0),
            sg_list: sge,
            num_sge: 1,
            opcode,
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            wr,
            ..Default::default()
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: a is live; the WR and SGE outlive the call; the SGE lies in a registered
        // region of `self` and the remote address in `target`, both alive until the
        // completion is polled or the QPs are destroyed (field order of Bed). The regions
        // the device writes (`sink`) are not borrowed by Rust until the completion.
        let rc = unsafe { ffi::ibv_post_send(self.a.as_raw(), &mut swr, &mut bad) };
        if rc != 0 {
            return Err(format!("ibv_post_send failed: {}", std::io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    }
}

/// Polls `cq` for one completion, for at most `timeout`.
fn wait(cq: &mut CompletionQueue, timeout: Duration, what: &str) -> std::result::Result<WorkCompletion, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match cq.poll_one() {
            Ok(Some(wc)) => return Ok(wc),
            Ok(None) if Instant::now() >= deadline => {
                return Err(format!(
                    "no completion for {what} within {timeout:?}: the provider or the device never completed it"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => return Err(format!("polling for {what}: {e}")),
        }
    }
}

fn expect(wc: WorkCompletion, opcode: WcOpcode) -> std::result::Result<WorkCompletion, String> {
    wc.ok().map_err(|e| e.to_string())?;
    if wc.opcode() != opcode {
        return Err(format!("completion opcode {:?}, expected {opcode:?}", wc.opcode()));
    }
    Ok(wc)
}

/// `got` holds `want` (and at least as many bytes), else where it first differs.
pub(crate) fn same(got: &[u8], want: &[u8], what: &str) -> std::result::Result<(), String> {
    if got.len() < want.len() {
        return Err(format!("{what}: {} bytes arrived, {} were sent", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!("{what} differs at byte {i}: {:#04x}, expected {:#04x}", got[i], want[i])),
    }
}

/// Devices return an atomic's old value in host order or, on some HCAs, big-endian.
pub(crate) fn returned_order(got: u64, want: u64) -> std::result::Result<&'static str, String> {
    if got == want {
        Ok("host byte order")
    } else if got == want.swap_bytes() {
        Ok("big-endian reply")
    } else {
        Err(format!("the atomic returned {got:#x}, the word held {want:#x}"))
    }
}

/// `len` bytes that differ with `seed` and along the buffer.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed.wrapping_mul(71))).collect()
}
