//! What wakes the watcher: Ctrl-C and SIGTERM (through a self-pipe of [`signal_hook`]),
//! a device's event queue or the kernel log becoming readable, and the clock; all in one
//! `poll`, so that it never blocks in `ibv_get_async_event`.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdma_verbs::AsyncEvents;
use rustix::event::{PollFd, PollFlags};

use super::Watcher;

/// Ctrl-C and SIGTERM: flags that say which came, and a self-pipe that wakes the `poll`.
pub(super) struct Stop {
    term: Arc<AtomicBool>,
    int: Arc<AtomicBool>,
    wake: UnixStream,
    ids: Vec<signal_hook::SigId>,
}

impl Stop {
    pub(super) fn install() -> std::io::Result<Stop> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let (wake, write) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        let (term, int) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        // Flags first: actions run in the order registered, so the flag is set before the
        // pipe wakes the loop.
        let ids = vec![
            signal_hook::flag::register(SIGTERM, Arc::clone(&term))?,
            signal_hook::flag::register(SIGINT, Arc::clone(&int))?,
            signal_hook::low_level::pipe::register(SIGTERM, write.try_clone()?)?,
            signal_hook::low_level::pipe::register(SIGINT, write)?,
        ];
        Ok(Stop { term, int, wake, ids })
    }

    /// The signal that asks the watch to end, if one came.
    pub(super) fn requested(&self) -> Option<&'static str> {
        if self.term.load(Ordering::SeqCst) {
            Some("SIGTERM")
        } else if self.int.load(Ordering::SeqCst) {
            Some("SIGINT")
        } else {
            None
        }
    }

    pub(super) fn drain(&mut self) {
        let mut buf = [0u8; 64];
        while matches!(self.wake.read(&mut buf), Ok(n) if n > 0) {}
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Waits until `timeout`, an event or a signal: ((a signal, an event queue readable), the
/// devices whose queue reported an error or hang-up).
pub(super) fn wait(w: &Watcher, stop: &Stop, timeout: Duration) -> ((bool, bool), Vec<String>) {
    let queues: Vec<(&String, &AsyncEvents)> =
        w.devices.iter().filter_map(|(n, q)| q.as_ref().map(|q| (n, q))).collect();
    let mut fds = vec![PollFd::new(&stop.wake, PollFlags::IN)];
    fds.extend(queues.iter().map(|(_, q)| PollFd::from_borrowed_fd(q.as_fd(), PollFlags::IN)));
    if let Ok(log) = &w.log {
        fds.push(PollFd::new(&log.file, PollFlags::IN));
    }
    let ts = rustix::event::Timespec::try_from(timeout).ok();
    // EINTR (a signal) and any other failure: look at the flags and the clock again.
    if rustix::event::poll(&mut fds, ts.as_ref()).is_err() {
        return ((false, false), Vec::new());
    }
    let bad = PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL;
    let signal = !fds[0].revents().is_empty();
    let event = fds[1..].iter().any(|f| f.revents().contains(PollFlags::IN));
    let broken = queues
        .iter()
        .zip(&fds[1..])
        .filter(|(_, f)| f.revents().intersects(bad) && !f.revents().contains(PollFlags::IN))
        .map(|((n, _), _)| (*n).clone())
        .collect();
    ((signal, event), broken)
}
