//! `scale_probe`: what connections and regions cost as their number grows, ours against
//! raw C, for `scripts/scale` (on rxe).
//!
//! ```text
//! scale_probe qps N WAY [ROUNDS]   N RC QPs, each 16 deep each way and connected to itself
//!                                  (loopback), their send CQ shared, their receive CQ
//!                                  shared (more CQs past the device's max_cqe); then
//!                                  ROUNDS rounds (default 0) of one 64 B WRITE posted on
//!                                  every QP, all completions taken from the shared CQ
//!   WAY  ours  QueuePair::builder, connect, send_queue and recv_queue claimed; each
//!              WRITE through SendQueue::post, each completion handed back by its queue
//!              (found by the completion's QP number)
//!        raw   ibv_create_qp and three ibv_modify_qp by hand; ibv_post_send, ibv_poll_cq
//! scale_probe regions K WAY         K regions of 4 KiB registered (ours: ProtectionDomain::
//!                                  register of an AlignedBuf; raw: ibv_reg_mr)
//! ```
//!
//! It prints one line of `key=value`s: `heap` (the bytes our Rust code holds on the heap
//! after the step, by a counting global allocator: 0 for raw C), `malloc` (what the C
//! allocator holds, mallinfo2, ours included), `mapped` (bytes mapped from the uverbs
//! device file: the provider's queues), `us` (microseconds of the step). For
//! callgrind (scripts/scale), it starts callgrind's instrumentation after the setup and
//! one warm-up round, and exits without tearing down.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use rdma_verbs::{
    ffi, AccessFlags, AlignedBuf, Chunk, CompletionQueue, Context, InitAttr, ProtectionDomain, QpAccess, QpType,
    QueuePair, RecvQueue, SendQueue, SendWr, WorkCompletion,
};

/// callgrind's client request that starts the counting (`start_instrumentation`).
#[path = "shared/callgrind.rs"]
mod callgrind;
use callgrind::start_instrumentation;

/// Counts the bytes our Rust code holds on the heap.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is System's, with the caller's arguments; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        HELD.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        HELD.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        HELD.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        HELD.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Each queue's depth, each way.
const DEPTH: u32 = 16;
const LEN: usize = 64;

/// What the process holds: (our heap, the C allocator's bytes in use, bytes mapped from
/// the uverbs device).
fn held() -> (isize, usize, usize) {
    // Read before the maps, whose text is on the heap meanwhile.
    let ours = HELD.load(Ordering::Relaxed);
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let m = unsafe { libc::mallinfo2() };
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mapped = maps
        .lines()
        .filter(|l| l.contains("uverbs"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(usize::from_str_radix(b, 16).ok()? - usize::from_str_radix(a, 16).ok()?)
        })
        .sum();
    (ours, m.uordblks, mapped)
}

/// Lets the device finish the round's `n` WRITEs before the polls, so that the number
/// of empty polls, which depends on timing, stays out of the count (scripts/scale leaves
/// this function out of it by its name, as scripts/instructions does the syscall probe's).
#[inline(never)]
fn settle(n: usize) {
    std::thread::sleep(std::time::Duration::from_micros(20_000 + 200 * n as u64));
}

/// Polls that found the CQ empty: timing that leaked into a count (printed at the end).
static EMPTY: AtomicIsize = AtomicIsize::new(0);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["qps", n, way] => qps(n.parse().unwrap_or(0), way, 0),
        ["qps", n, way, rounds] => qps(n.parse().unwrap_or(0), way, rounds.parse().unwrap_or(0)),
        ["regions", k, way] => regions(k.parse().unwrap_or(0), way),
        _ => Err("usage: scale_probe qps N ours|raw [ROUNDS] | regions K ours|raw".into()),
    };
    if let Err(e) = r {
        eprintln!("scale_probe: {e}");
        std::process::exit(1);
    }
    std::process::exit(0)
}

fn open() -> Res<(Context, ProtectionDomain)> {
    let ctx = match std::env::var("RDMA_DEVICE") {
        Ok(name) => Context::open(Some(&name))?,
        Err(_) => Context::open_first()?,
    };
    let pd = ProtectionDomain::new(&ctx)?;
    Ok((ctx, pd))
}

/// The shared CQs: as few as hold `n` queues of DEPTH each (one up to the device's max_cqe).
fn cqs(ctx: &Context, n: usize) -> Res<Vec<CompletionQueue>> {
    let max = ctx.query_device()?.max_cqe as usize;
    let per = max / DEPTH as usize;
    let count = n.div_ceil(per).max(1);
    (0..count).map(|i| Ok(CompletionQueue::new(ctx, (per.min(n - i * per) * DEPTH as usize) as u32)?)).collect()
}

fn qps(n: usize, way: &str, rounds: usize) -> Res<()> {
    if n == 0 {
        return Err("N from 1".into());
    }
    let (ctx, pd) = open()?;
    let (scqs, rcqs) = (cqs(&ctx, n)?, cqs(&ctx, n)?);
    let per = (ctx.query_device()?.max_cqe / DEPTH) as usize;
    let target = pd.register_remote_writable(AlignedBuf::new(LEN)?, AccessFlags::REMOTE_WRITE)?;
    let remote = target.remote()?;
    let srcs = pd.register(AlignedBuf::new(n * LEN)?, AccessFlags::LOCAL_WRITE)?.into_chunks(LEN)?;
    let before = held();
    let t = Instant::now();
    let line = match way {
        "ours" => {
            let init = InitAttr { access: QpAccess::REMOTE_WRITE, ..InitAttr::default() };
            let mut qps = Vec::with_capacity(n);
            for i in 0..n {
                let qp = QueuePair::builder(&pd, QpType::Rc, &scqs[i / per], &rcqs[i / per])
                    .max_send_wr(DEPTH)
                    .max_recv_wr(DEPTH)
                    .build()?;
                let me = qp.local_info(1)?;
                qp.connect(&init, &me)?;
                qps.push(qp);
            }
            let made = held();
            let mut queues: Vec<(SendQueue<Chunk>, RecvQueue<Chunk>)> = Vec::with_capacity(n);
            for qp in &qps {
                queues.push((qp.send_queue()?, qp.recv_queue()?));
            }
            let us = t.elapsed().as_micros();
            let after = held();
            let line = report(n, before, made, after, us);
            if rounds > 0 {
                let by_qpn: HashMap<u32, usize> = qps.iter().enumerate().map(|(i, q)| (q.qp_num(), i)).collect();
                writes_ours(&mut scqs.into_iter().next().ok_or("no CQ")?, &mut queues, srcs, remote, &by_qpn, rounds)?;
            }
            line
        }
        "raw" => {
            let mut raws = Vec::with_capacity(n);
            for i in 0..n {
                raws.push(raw_qp(&ctx, &pd, &scqs[i / per], &rcqs[i / per])?);
            }
            let us = t.elapsed().as_micros();
            let after = held();
            let line = report(n, before, after, after, us);
            if rounds > 0 {
                writes_raw(&scqs[0], &raws, &srcs, remote, rounds)?;
            }
            line
        }
        _ => return Err(format!("no way {way:?}: ours or raw").into()),
    };
    println!("{line} empty_polls={}", EMPTY.load(Ordering::Relaxed));
    Ok(())
}

/// The line of a step of `n`: per QP, our heap and the C allocator's bytes for the QPs
/// (`made`) and for the queues claimed after them (`after`), the mapped bytes, the time.
fn report(
    n: usize,
    before: (isize, usize, usize),
    made: (isize, usize, usize),
    after: (isize, usize, usize),
    us: u128,
) -> String {
    let n = n as f64;
    format!(
        "n={} heap_qp={:.0} heap_queues={:.0} malloc={:.0} mapped={:.0} us={:.1}",
        n,
        (made.0 - before.0) as f64 / n,
        (after.0 - made.0) as f64 / n,
        (after.1 as f64 - before.1 as f64) / n,
        (after.2 as f64 - before.2 as f64) / n,
        us as f64 / n
    )
}

/// `rounds` rounds of one WRITE on every QP; all completions from `cq`, each handed back
/// by its queue. The first round before callgrind counts.
fn writes_ours(
    cq: &mut CompletionQueue,
    queues: &mut [(SendQueue<Chunk>, RecvQueue<Chunk>)],
    srcs: Vec<Chunk>,
    target: rdma_verbs::RemoteMr,
    by_qpn: &HashMap<u32, usize>,
    rounds: usize,
) -> Res<()> {
    let mut bufs: Vec<Option<Chunk>> = srcs.into_iter().map(Some).collect();
    let mut wcs = [WorkCompletion::EMPTY; 16];
    for round in 0..=rounds {
        if round == 1 {
            start_instrumentation();
        }
        for (i, (sq, _)) in queues.iter_mut().enumerate() {
            let b = bufs[i].take().ok_or("a source did not come back")?;
            sq.post(SendWr::write(b, 0..LEN, target)).map_err(rdma_verbs::Error::from)?;
        }
        settle(queues.len());
        let mut got = 0;
        while got < queues.len() {
            let done = cq.poll(&mut wcs)?;
            if done.is_empty() {
                EMPTY.fetch_add(1, Ordering::Relaxed);
            }
            for wc in done.iter_mut() {
                wc.ok()?;
                let i = *by_qpn.get(&wc.qp_num()).ok_or("a completion of no QP of ours")?;
                queues[i].0.complete(wc, |d| bufs[i] = Some(d.value))?;
                got += 1;
            }
        }
    }
    Ok(())
}

fn writes_raw(
    cq: &CompletionQueue,
    qps: &[*mut ffi::ibv_qp],
    srcs: &[Chunk],
    target: rdma_verbs::RemoteMr,
    rounds: usize,
) -> Res<()> {
    // SAFETY: plain data, all-zero valid.
    let mut wcs: [ffi::ibv_wc; 16] = unsafe { std::mem::zeroed() };
    for round in 0..=rounds {
        if round == 1 {
            start_instrumentation();
        }
        for (i, &qp) in qps.iter().enumerate() {
            let mut sge = ffi::ibv_sge { addr: srcs[i].addr(), length: LEN as u32, lkey: srcs[i].lkey() };
            // SAFETY: plain data, all-zero valid; the fields a WRITE needs are set below.
            let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = i as u64;
            (wr.sg_list, wr.num_sge) = (&mut sge, 1);
            (wr.opcode, wr.send_flags) =
                (ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE, ffi::ibv_send_flags::IBV_SEND_SIGNALED.0);
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: target.addr, rkey: target.rkey };
            let mut bad = std::ptr::null_mut();
            // SAFETY: a connected QP of ours; the SGE names registered bytes that outlive it.
            let rc = unsafe { ffi::ibv_post_send(qp, &mut wr, &mut bad) };
            if rc != 0 {
                return Err(format!("ibv_post_send: {rc}").into());
            }
        }
        settle(qps.len());
        let mut got = 0;
        while got < qps.len() {
            // SAFETY: the CQ is alive; `wcs` has room for 16.
            let k = unsafe { ffi::ibv_poll_cq(cq.as_raw(), 16, wcs.as_mut_ptr()) };
            let k = usize::try_from(k).map_err(|_| "ibv_poll_cq failed")?;
            if k == 0 {
                EMPTY.fetch_add(1, Ordering::Relaxed);
            }
            for wc in &wcs[..k] {
                if wc.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
                    return Err(format!("wr_id {} failed: {}", wc.wr_id, wc.status.0).into());
                }
            }
            got += k;
        }
    }
    Ok(())
}

/// An RC QP made and connected to itself in C: ibv_create_qp, then INIT, RTR, RTS.
fn raw_qp(ctx: &Context, pd: &ProtectionDomain, scq: &CompletionQueue, rcq: &CompletionQueue) -> Res<*mut ffi::ibv_qp> {
    // SAFETY: plain data, all-zero valid; the fields are set below.
    let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    (init.send_cq, init.recv_cq, init.qp_type) = (scq.as_raw(), rcq.as_raw(), ffi::ibv_qp_type::IBV_QPT_RC);
    (init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge, init.cap.max_recv_sge) = (DEPTH, DEPTH, 1, 1);
    // SAFETY: the PD and CQs are alive for the process (the probe never tears down).
    let qp = unsafe { ffi::ibv_create_qp(pd.as_raw(), &mut init) };
    if qp.is_null() {
        return Err(format!("ibv_create_qp: {}", std::io::Error::last_os_error()).into());
    }
    let gid_index: u8 = std::env::var("RDMA_GID_INDEX").ok().and_then(|g| g.parse().ok()).unwrap_or(1);
    // SAFETY: plain data; the GID is written by ibv_query_gid.
    let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
    // SAFETY: a live context, port 1, a GID index of the test bed.
    if unsafe { ffi::ibv_query_gid(ctx.as_raw(), 1, gid_index.into(), &mut gid) } != 0 {
        return Err("ibv_query_gid failed".into());
    }
    // SAFETY: plain data, all-zero valid.
    let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    let modify = |a: &mut ffi::ibv_qp_attr, mask: u32, what: &str| -> Res<()> {
        // SAFETY: a QP of ours and the attributes the mask names.
        match unsafe { ffi::ibv_modify_qp(qp, a, mask as i32) } {
            0 => Ok(()),
            rc => Err(format!("ibv_modify_qp to {what}: {}", std::io::Error::from_raw_os_error(rc)).into()),
        }
    };
    use ffi::ibv_qp_attr_mask as m;
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
    (a.pkey_index, a.port_num) = (0, 1);
    a.qp_access_flags = ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    modify(&mut a, (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS).0, "INIT")?;
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
    // SAFETY: the QP was just made.
    let qpn = unsafe { (*qp).qp_num };
    (a.path_mtu, a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic, a.min_rnr_timer) =
        (ffi::ibv_mtu::IBV_MTU_1024, qpn, 0, 1, 12);
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    (a.ah_attr.grh.dgid, a.ah_attr.grh.sgid_index, a.ah_attr.grh.hop_limit) = (gid, gid_index, 1);
    modify(
        &mut a,
        (m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER)
            .0,
        "RTR",
    )?;
    a.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
    (a.timeout, a.retry_cnt, a.rnr_retry, a.sq_psn, a.max_rd_atomic) = (14, 7, 7, 0, 1);
    modify(
        &mut a,
        (m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC)
            .0,
        "RTS",
    )?;
    Ok(qp)
}

/// K regions of 4 KiB registered, ours or raw; prints heap and time per region.
fn regions(k: usize, way: &str) -> Res<()> {
    if k == 0 {
        return Err("K from 1".into());
    }
    let (_ctx, pd) = open()?;
    let before = held();
    let t = Instant::now();
    match way {
        "ours" => {
            let mut mrs = Vec::with_capacity(k);
            for _ in 0..k {
                mrs.push(pd.register(AlignedBuf::new(4096)?, AccessFlags::LOCAL_WRITE)?);
            }
            let us = t.elapsed().as_micros();
            let after = held();
            println!("{}", region_line(k, before, after, us));
            std::mem::forget(mrs);
        }
        "raw" => {
            for _ in 0..k {
                let mut p = std::ptr::null_mut();
                // SAFETY: posix_memalign writes a 4 KiB block's address into `p`.
                if unsafe { libc::posix_memalign(&mut p, 4096, 4096) } != 0 {
                    return Err("posix_memalign failed".into());
                }
                // SAFETY: a live PD and 4 KiB of ours, never freed.
                let mr = unsafe {
                    ffi::ibv_reg_mr(pd.as_raw(), p, 4096, ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32)
                };
                if mr.is_null() {
                    return Err(format!("ibv_reg_mr: {}", std::io::Error::last_os_error()).into());
                }
            }
            let us = t.elapsed().as_micros();
            let after = held();
            println!("{}", region_line(k, before, after, us));
        }
        _ => return Err(format!("no way {way:?}: ours or raw").into()),
    }
    Ok(())
}

fn region_line(k: usize, before: (isize, usize, usize), after: (isize, usize, usize), us: u128) -> String {
    let k = k as f64;
    format!(
        "n={} heap={:.0} malloc={:.0} us={:.1}",
        k,
        (after.0 - before.0) as f64 / k,
        (after.1 as f64 - before.1 as f64) / k,
        us as f64 / k
    )
}
