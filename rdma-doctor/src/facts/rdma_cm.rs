//! The rdma_cm check: the path most applications connect by (librdmacm, the kernel's
//! rdma_ucm and `/dev/infiniband/rdma_cm`, address and route resolution, the CM
//! handshake), end to end over loopback. A listener bound to the device's IPv4 address
//! (its RoCE v2 GID) on a free port takes one connection from a client in the same
//! process, and one SEND of a known message is received and compared. Every wait is
//! bounded by the timeout.
//!
//! librdmacm opens the device's context the first time an id binds to it and keeps it
//! open until the process exits (see rdma-verbs' `cm` module): after this check the
//! process holds one device context more, and an rxe link of that device cannot be
//! deleted until the process ends.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, AlignedBuf, Chunk, CmId, CompletionQueue, ConnParam, EventChannel, PortSpace, ProtectionDomain,
    QpType, QueuePair, RecvQueue, SendQueue, SendWr, WorkCompletion,
};

/// The message the client sends and the server compares.
pub const MESSAGE: &[u8; 32] = b"rdma-doctor rdma_cm loopback ok.";

/// What the rdma_cm check did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmReport {
    /// The address the listener was bound to (`10.99.0.1:40123`), once bound.
    pub address: Option<String>,
    /// What was verified, when it worked.
    pub verified: Option<String>,
    /// The step that failed and why, when it did not.
    pub error: Option<String>,
    /// Milliseconds the whole check took.
    pub elapsed_ms: u64,
}

type Steps<T> = Result<T, String>;

/// Listens on `ip` (port 0: a free one), connects to it and passes [`MESSAGE`], waiting
/// at most `timeout` for each event and completion.
pub fn run(ip: Ipv4Addr, timeout: Duration) -> CmReport {
    let start = Instant::now();
    let mut report = CmReport::default();
    match exchange(ip, timeout, &mut report.address) {
        Ok(v) => report.verified = Some(v),
        Err(e) => report.error = Some(e),
    }
    report.elapsed_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    report
}

/// `what` failed: the error with the step named.
fn at(what: &'static str) -> impl Fn(rdma_verbs::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn exchange(ip: Ipv4Addr, timeout: Duration, bound: &mut Option<String>) -> Steps<String> {
    std::thread::scope(|s| {
        let mut client = None;
        let served = serve_one(ip, timeout, |addr| {
            *bound = Some(addr.to_string());
            client = Some(s.spawn(move || connect_and_send(addr, timeout)));
            Ok(())
        });
        let sent = client.map(|c| c.join().unwrap_or_else(|_| Err("the client side panicked".into())));
        // The client's error first: a server that saw no request is its consequence.
        sent.unwrap_or(Ok(())).and(served)
    })
}

/// Listens on `ip` (a free port), tells `announce` the address, then takes one
/// connection and checks its message ([`MESSAGE`]). The server half of the check, also
/// run across two nodes by `rdma-doctor --serve` ([`crate::modes::peer`]).
pub(crate) fn serve_one(
    ip: Ipv4Addr,
    timeout: Duration,
    announce: impl FnOnce(SocketAddr) -> Steps<()>,
) -> Steps<String> {
    let channel = EventChannel::new().map_err(at("opening /dev/infiniband/rdma_cm (rdma_create_event_channel)"))?;
    let listener = CmId::new(&channel, PortSpace::Tcp).map_err(at("rdma_create_id"))?;
    listener.bind(SocketAddr::new(ip.into(), 0)).map_err(at("binding the listener (rdma_bind_addr)"))?;
    listener.listen(1).map_err(at("rdma_listen"))?;
    let addr = listener.local_addr().ok_or("the bound listener has no local address")?;
    announce(addr)?;
    serve(&listener, timeout)
}

/// A QP with one send and one receive, and two registered message buffers.
struct Side {
    qp: QueuePair,
    cq: CompletionQueue,
    bufs: Vec<Chunk>,
}

fn side(id: &CmId) -> Steps<Side> {
    let ctx = id.context().map_err(at("the id's device context"))?;
    let pd = ProtectionDomain::new(&ctx).map_err(at("ibv_alloc_pd"))?;
    let cq = CompletionQueue::new(&ctx, 4).map_err(at("ibv_create_cq"))?;
    let builder = QueuePair::builder(&pd, QpType::Rc, &cq, &cq).max_send_wr(1).max_recv_wr(1).sq_sig_all(true);
    let qp = id.create_qp(builder).map_err(at("rdma_create_qp"))?;
    let buf = AlignedBuf::new(2 * MESSAGE.len()).map_err(at("allocating the message buffers"))?;
    let bufs = pd
        .register(buf, AccessFlags::LOCAL_WRITE)
        .and_then(|mr| mr.into_chunks(MESSAGE.len()))
        .map_err(at("ibv_reg_mr"))?;
    Ok(Side { qp, cq, bufs })
}

/// Takes one request, posts a receive, accepts, and checks the message that arrives.
fn serve(listener: &CmId, timeout: Duration) -> Steps<String> {
    let id = listener.get_request(timeout).map_err(at("waiting for the connection request"))?.into_id();
    let Side { qp, mut cq, mut bufs } = side(&id)?;
    let mut rq: RecvQueue<Chunk> = qp.recv_queue().map_err(at("the receive queue"))?;
    let buf = bufs.pop().ok_or("no receive buffer")?;
    rq.post(buf, 0..MESSAGE.len(), 1).map_err(|r| format!("ibv_post_recv: {}", r.error))?;
    id.accept(&ConnParam::new(), timeout).map_err(at("rdma_accept"))?;
    let mut wc = wait_one(&mut cq, timeout, "the receive of the message")?;
    let got = rq.complete(&mut wc).map_err(at("the receive of the message"))?;
    let len = usize::try_from(got.byte_len).unwrap_or(usize::MAX).min(got.value.len());
    if &got.value[..len] != MESSAGE.as_slice() {
        return Err(format!("the message arrived changed: {:02x?}", &got.value[..len]));
    }
    // Tear down after the client did (its send completes on our acknowledgement): a
    // bounded wait for its disconnect, whose outcome changes nothing.
    let _ = id.next_event(timeout);
    Ok(format!("a {}-byte message received over rdma_cm and verified", MESSAGE.len()))
}

/// Resolves `dst`, connects, and sends [`MESSAGE`]: the client half of the check.
pub(crate) fn connect_and_send(dst: SocketAddr, timeout: Duration) -> Steps<()> {
    let channel = EventChannel::new().map_err(at("opening /dev/infiniband/rdma_cm (rdma_create_event_channel)"))?;
    let id = CmId::new(&channel, PortSpace::Tcp).map_err(at("rdma_create_id"))?;
    id.resolve_addr(None, dst, timeout).map_err(at("rdma_resolve_addr"))?;
    id.resolve_route(timeout).map_err(at("rdma_resolve_route"))?;
    let Side { qp, mut cq, mut bufs } = side(&id)?;
    let mut sq: SendQueue<Chunk> = qp.send_queue().map_err(at("the send queue"))?;
    let mut buf = bufs.pop().ok_or("no send buffer")?;
    buf.copy_from_slice(MESSAGE);
    id.connect(&ConnParam::new(), timeout).map_err(at("rdma_connect"))?;
    sq.post(SendWr::send(buf, 0..MESSAGE.len()).id(2)).map_err(|r| format!("ibv_post_send: {}", r.error))?;
    let mut wc = wait_one(&mut cq, timeout, "the send of the message")?;
    sq.complete(&mut wc, drop).map_err(at("the send of the message"))?;
    // The server may be gone already: no failure.
    let _ = id.disconnect();
    Ok(())
}

/// Polls `cq` for one completion, for at most `timeout`.
pub(crate) fn wait_one(cq: &mut CompletionQueue, timeout: Duration, what: &str) -> Steps<WorkCompletion> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(wc) = cq.poll_one().map_err(|e| format!("polling for {what}: {e}"))? {
            return Ok(wc);
        }
        if Instant::now() > deadline {
            return Err(format!("no completion for {what} within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `/dev/infiniband/rdma_cm` as the kernel and this process see it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmNode {
    /// The device number rdma_ucm registered (`/sys/class/misc/rdma_cm/dev`, `10:58`);
    /// `None` when rdma_ucm is not loaded.
    pub kernel_dev: Option<String>,
    /// Whether the path exists.
    pub exists: bool,
    /// Its `MAJOR:MINOR` when it is a character device.
    pub node_dev: Option<String>,
    /// Whether something is mounted on the path (a bind mount hides the device).
    pub mounted_over: bool,
}

/// The path librdmacm opens.
pub const NODE: &str = "/dev/infiniband/rdma_cm";

/// Looks at [`NODE`] (every file read with the crate's size limit).
pub fn node() -> CmNode {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(NODE).ok();
    let kernel_dev = crate::model::input::read_limited(std::path::Path::new("/sys/class/misc/rdma_cm/dev"))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    let mountinfo = crate::model::input::read_limited(std::path::Path::new("/proc/self/mountinfo")).unwrap_or_default();
    CmNode {
        kernel_dev,
        exists: meta.is_some(),
        node_dev: meta.filter(|m| m.file_type().is_char_device()).map(|m| dev_name(m.rdev())),
        mounted_over: mount_point(&mountinfo, NODE),
    }
}

/// `MAJOR:MINOR` of a Linux `dev_t`.
fn dev_name(dev: u64) -> String {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    format!("{major}:{minor}")
}

/// Whether `/proc/self/mountinfo` text lists `path` as a mount point (the fifth field).
fn mount_point(mountinfo: &str, path: &str) -> bool {
    mountinfo.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_and_mount_points_read_as_the_kernel_writes_them() {
        assert_eq!(dev_name(0x0a3a), "10:58");
        assert_eq!(dev_name(0x1ff03), "511:3");
        assert_eq!(dev_name(0x0103), "1:3");
        let info = "36 25 0:5 /null /dev/infiniband/rdma_cm rw,nosuid shared:2 - devtmpfs udev rw\n\
                    25 1 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw\n";
        assert!(mount_point(info, NODE));
        assert!(!mount_point(&info.replace("/dev/infiniband/rdma_cm", "/dev/shm"), NODE));
        assert!(!mount_point("garbage\n\n", NODE));
    }
}
