//! The device's asynchronous events: timeouts with nothing pending, and real port events
//! caused by taking the netdev under the RoCE device down and up again.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use rdma_verbs::{AsyncEvent, AsyncEventKind, AsyncEvents, Context, Error, EventSource, GidEntry, PortState, Verb};

use crate::{open, LeakCheck};

/// rxe reports a link change at once; emulation and the GID work around it can be slow.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
#[ignore = "needs an RDMA device: run scripts/test"]
fn waiting_for_an_async_event_with_none_pending_times_out() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let events = ctx.async_events().unwrap();
    // SAFETY: F_GETFL on the context's open event descriptor.
    let flags = unsafe { libc::fcntl(events.as_raw_fd(), libc::F_GETFL) };
    assert!(flags >= 0 && flags & libc::O_NONBLOCK != 0, "the event fd must not block: {flags:#x}");

    assert!(events.try_next().unwrap().is_none());
    let wait = Duration::from_millis(300);
    let start = Instant::now();
    let err = events.wait(Some(wait)).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::Timeout { verb: Verb::GetAsyncEvent, timeout } if timeout == wait), "{err:?}");
    assert!(took >= wait, "returned after {took:?}, before the timeout");
    assert!(took < wait + Duration::from_secs(5), "took {took:?}");

    let err = ctx.async_event(Some(Duration::ZERO)).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "a zero timeout only looks: {err:?}");
}

#[test]
#[ignore = "needs an RDMA device (RoCE, run as root): run scripts/test"]
fn netdev_down_then_up_reports_port_err_then_port_active_on_port_1() {
    let _leaks = LeakCheck::new();
    let ctx = open();
    let gid = ctx.default_gid(1).unwrap();
    let netdev = gid.netdev.clone().expect("a RoCE device: the default GID names its netdev");
    let events = ctx.async_events().unwrap();
    while let Some(stale) = events.try_next().unwrap() {
        eprintln!("before the test: {stale}");
    }

    let link = LinkGuard { ctx: ctx.clone(), netdev: netdev.clone(), gid: gid.clone() };
    ip_link(&netdev, "down");
    // The descriptor alone says an event is there, as an event loop would see it.
    let mut pfd = libc::pollfd { fd: events.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, EVENT_TIMEOUT.as_millis() as i32) };
    assert_eq!(ready, 1, "the event fd became readable after `ip link set {netdev} down`");
    let down = wait_for(&events, AsyncEventKind::PortErr);
    assert_eq!(down.source, EventSource::Port(1), "{down}");
    assert_ne!(ctx.query_port(1).unwrap().state, PortState::Active);

    ip_link(&netdev, "up");
    let up = wait_for(&events, AsyncEventKind::PortActive);
    assert_eq!(up.source, EventSource::Port(1), "{up}");
    assert_eq!(up.to_string(), "PortActive on port 1");

    link.restore().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ctx.query_port(1).unwrap().state, PortState::Active);
}

/// Waits for the first event of `kind`, printing the others (GID changes come and go
/// with the netdev's IPv6 link-local address).
fn wait_for(events: &AsyncEvents, kind: AsyncEventKind) -> AsyncEvent {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match events.wait(Some(left)) {
            Ok(e) if e.kind == kind => return e,
            Ok(other) => eprintln!("while waiting for {kind:?}: {other}"),
            Err(e) => panic!("no {kind:?} event: {e}"),
        }
    }
}

fn ip_link(netdev: &str, state: &str) {
    let out = Command::new("ip").args(["link", "set", netdev, state]).output().expect("run `ip` (iproute2)");
    assert!(out.status.success(), "ip link set {netdev} {state}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Puts the link back up, whatever happens in the test: the tests after this one need the
/// port active with its GID in place.
struct LinkGuard {
    ctx: Context,
    netdev: String,
    gid: GidEntry,
}

impl LinkGuard {
    /// Link up, then wait until the port is active and the default GID is back as it was.
    fn restore(&self) -> Result<(), String> {
        let out = Command::new("ip").args(["link", "set", &self.netdev, "up"]).output();
        if let Ok(out) = &out {
            if !out.status.success() {
                return Err(format!("ip link set {} up: {}", self.netdev, String::from_utf8_lossy(&out.stderr)));
            }
        }
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            let active = self.ctx.query_port(1).map(|p| p.state == PortState::Active).unwrap_or(false);
            let gid = self.ctx.default_gid(1).ok();
            let same = gid.as_ref().is_some_and(|g| g.index == self.gid.index && g.gid == self.gid.gid);
            if active && same {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} is not back: port active {active}, default GID now {gid:?}, was {:?}",
                    self.netdev, self.gid
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            eprintln!("restoring the link: {e}");
        }
    }
}
