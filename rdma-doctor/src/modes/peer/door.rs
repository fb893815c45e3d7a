//! The TCP side of `--serve`, which needs no device: who gets in, and for how long.
//!
//! One loop takes every connection at once and reads the hellos of all of them without
//! blocking. A connection holds nothing of the device until its hello line is complete,
//! and must complete it within the hello time (the server's `--timeout`): a silent
//! client, or one that sends a byte every two seconds, is closed then. At most
//! [`MAX_WAITING`] connections wait for their hello; a new one beyond that closes the
//! oldest waiting one (it had the longest to speak; an honest prober speaks within its
//! first round trip), so a crowd of silent connections cannot keep a prober out.
//!
//! A complete hello starts the probe in a thread of its own, with its own QP: up to
//! [`MAX_PROBES`] at once; past that the client gets one `BUSY ...` line and is closed at
//! once, never queued. Every read and write of a probe is bounded by the exchange's
//! deadline, [`EXCHANGE_TIMEOUTS`] timeouts after the connection was accepted, so no
//! client holds a probe slot longer than that.
//!
//! Before any of that, a client the allow-list does not admit (`--allow`, on the peer's
//! address) is closed as it is accepted, before a byte is read. A server with a secret
//! (`--secret-file`) writes its challenge to each client it admits, and a hello without a
//! valid proof ([`crate::modes::gate`]) closes the connection unanswered.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::LINE_MAX;
use crate::modes::gate::{self, AllowList, Secret};

/// Probes answered at once; a client whose hello is complete beyond that gets one `BUSY`
/// line and is closed.
pub const MAX_PROBES: usize = 16;
/// Connections waiting for their hello; a new one beyond that closes the oldest waiting.
pub const MAX_WAITING: usize = 64;
/// A whole exchange, from accept to the last answer, lasts at most this many timeouts.
pub const EXCHANGE_TIMEOUTS: u32 = 24;
/// How long the loop sleeps when nothing happened.
const TICK: Duration = Duration::from_millis(10);

/// What the door lets in.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Probes at once.
    pub probes: usize,
    /// Connections waiting for their hello.
    pub waiting: usize,
    /// From accept to a complete hello.
    pub hello: Duration,
    /// From accept to the end of the exchange: it bounds every read and write of a probe.
    /// Not the per-operation timeout: between two requests the prober may wait its own
    /// timeout for a completion, and rebuild its QPs.
    pub exchange: Duration,
    /// The clients admitted, by their address.
    pub allow: AllowList,
    /// The secret a hello proves, when there is one.
    pub secret: Option<Secret>,
}

impl Limits {
    /// The limits of a server whose `--timeout` is `timeout`, open to every address with
    /// no secret.
    pub(crate) fn for_timeout(timeout: Duration) -> Limits {
        Limits {
            probes: MAX_PROBES,
            waiting: MAX_WAITING,
            hello: timeout,
            exchange: timeout * EXCHANGE_TIMEOUTS,
            allow: AllowList::default(),
            secret: None,
        }
    }
}

/// A control connection whose every read and write is bounded by `per_op` and by the
/// exchange's deadline (when it has one).
#[derive(Debug)]
pub(crate) struct Control {
    stream: TcpStream,
    per_op: Duration,
    deadline: Option<Instant>,
}

impl Control {
    pub(crate) fn new(stream: TcpStream, per_op: Duration, deadline: Option<Instant>) -> Control {
        stream.set_nodelay(true).ok();
        Control { stream, per_op, deadline }
    }

    /// The wait allowed for the next read or write.
    fn bound(&self) -> io::Result<Duration> {
        match self.deadline {
            None => Ok(self.per_op),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the exchange's deadline passed"));
                }
                Ok(left.min(self.per_op))
            }
        }
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }
}

impl Read for Control {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let t = self.bound()?;
        self.stream.set_read_timeout(Some(t))?;
        self.stream.read(buf)
    }
}

impl Write for Control {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let t = self.bound()?;
        self.stream.set_write_timeout(Some(t))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A connection that has not finished its hello.
struct Waiting {
    stream: TcpStream,
    from: SocketAddr,
    since: Instant,
    line: Vec<u8>,
    /// The challenge written to it, when the server has a secret.
    challenge: Option<String>,
}

enum Heard {
    Nothing,
    Hello(String),
    Gone(String),
}

impl Waiting {
    /// Reads what arrived, without blocking.
    fn listen(&mut self, hello: Duration) -> Heard {
        let mut buf = [0u8; 1024];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Heard::Gone("closed before its hello".into()),
                Ok(n) => {
                    self.line.extend_from_slice(&buf[..n]);
                    if let Some(end) = self.line.iter().position(|b| *b == b'\n') {
                        // The prober sends nothing after its hello until it has the server's.
                        if end + 1 != self.line.len() {
                            return Heard::Gone("sent more than a hello".into());
                        }
                        self.line.truncate(end);
                        return Heard::Hello(String::from_utf8_lossy(&self.line).into_owned());
                    }
                    if self.line.len() > LINE_MAX {
                        return Heard::Gone(format!("a hello over {LINE_MAX} bytes"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Heard::Gone(e.to_string()),
            }
        }
        if self.since.elapsed() > hello {
            Heard::Gone(format!("no complete hello within {hello:?}"))
        } else {
            Heard::Nothing
        }
    }
}

/// Gives a probe slot back when the probe's thread ends, however it ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves on `listener` until a probe completes when `once` (its status: 0 when
/// `answer` returned `Ok`), else until accepting fails. `answer` gets each connection
/// whose hello is complete, with the hello line, in a thread of its own; what happens to
/// every connection is logged on `log`.
pub(crate) fn serve<A>(
    listener: TcpListener,
    limits: &Limits,
    once: bool,
    answer: A,
    log: &mut dyn Write,
) -> Result<i32, String>
where
    A: Fn(Control, String) -> Result<(), String> + Send + Sync + 'static,
{
    listener.set_nonblocking(true).map_err(|e| format!("the listening socket: {e}"))?;
    let answer = Arc::new(answer);
    let running = Arc::new(AtomicUsize::new(0));
    let (done_tx, done) = mpsc::channel::<(SocketAddr, Result<(), String>)>();
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    loop {
        let mut idle = true;
        loop {
            match listener.accept() {
                Ok((stream, from)) if !limits.allow.admits(from.ip()) => {
                    idle = false;
                    drop(stream);
                    let _ = writeln!(log, "rdma-doctor: closed {from} unread: not in --allow ({})", limits.allow);
                }
                Ok((mut stream, from)) => {
                    idle = false;
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let challenge = match &limits.secret {
                        None => None,
                        // A short line into an empty socket buffer: it does not block.
                        Some(_) => match gate::challenge()
                            .and_then(|c| stream.write_all(format!("{c}\n").as_bytes()).map(|()| c))
                        {
                            Ok(c) => Some(c),
                            Err(e) => {
                                let _ = writeln!(log, "rdma-doctor: closed {from}: writing its challenge: {e}");
                                continue;
                            }
                        },
                    };
                    if waiting.len() >= limits.waiting {
                        if let Some(old) = waiting.pop_front() {
                            let _ = writeln!(
                                log,
                                "rdma-doctor: closed {}: no hello yet, and {} connections wait for theirs",
                                old.from, limits.waiting
                            );
                        }
                    }
                    waiting.push_back(Waiting { stream, from, since: Instant::now(), line: Vec::new(), challenge });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors and the like: this round takes no more.
                Err(e) => {
                    let _ = writeln!(log, "rdma-doctor: accepting a probe: {e}");
                    break;
                }
            }
        }
        let mut i = 0;
        while i < waiting.len() {
            match waiting[i].listen(limits.hello) {
                Heard::Nothing => i += 1,
                Heard::Gone(why) => {
                    idle = false;
                    if let Some(w) = waiting.remove(i) {
                        let _ = writeln!(log, "rdma-doctor: closed {}: {why}", w.from);
                    }
                }
                Heard::Hello(line) => {
                    idle = false;
                    let Some(w) = waiting.remove(i) else { continue };
                    let proven = match &limits.secret {
                        Some(secret) => w.challenge.as_ref().and_then(|c| secret.verify(c, &line)),
                        None => Some(line),
                    };
                    match proven {
                        Some(hello) => start(w, hello, limits, &running, &answer, &done_tx, log),
                        None => {
                            let _ = writeln!(
                                log,
                                "rdma-doctor: closed {} unanswered: no valid proof of the secret",
                                w.from
                            );
                        }
                    }
                }
            }
        }
        while let Ok((from, verdict)) = done.try_recv() {
            idle = false;
            let _ = match &verdict {
                Ok(()) => writeln!(log, "rdma-doctor: probe from {from}: done"),
                Err(e) => writeln!(log, "rdma-doctor: probe from {from}: {e}"),
            };
            if once {
                return Ok(i32::from(verdict.is_err()));
            }
        }
        if idle {
            std::thread::sleep(TICK);
        }
    }
}

/// Starts the probe of `w` in a thread of its own, or answers `BUSY` when every slot is taken.
fn start<A>(
    w: Waiting,
    hello: String,
    limits: &Limits,
    running: &Arc<AtomicUsize>,
    answer: &Arc<A>,
    done: &mpsc::Sender<(SocketAddr, Result<(), String>)>,
    log: &mut dyn Write,
) where
    A: Fn(Control, String) -> Result<(), String> + Send + Sync + 'static,
{
    let Waiting { mut stream, from, since, .. } = w;
    if running.fetch_add(1, Ordering::SeqCst) >= limits.probes {
        running.fetch_sub(1, Ordering::SeqCst);
        // A short line into an empty socket buffer: it does not block.
        let _ = stream.write_all(
            format!("BUSY rdma-doctor --serve is answering {} probes, its limit: try again shortly\n", limits.probes)
                .as_bytes(),
        );
        let _ = writeln!(log, "rdma-doctor: closed {from}: busy ({} probes running)", limits.probes);
        return;
    }
    let slot = Slot(Arc::clone(running));
    let ctl =
        stream.set_nonblocking(false).map(|()| Control::new(stream, limits.exchange, Some(since + limits.exchange)));
    let (answer, done) = (Arc::clone(answer), done.clone());
    let spawned = std::thread::Builder::new().name(format!("probe {from}")).spawn(move || {
        let verdict = ctl.map_err(|e| e.to_string()).and_then(|ctl| answer(ctl, hello));
        drop(slot);
        let _ = done.send((from, verdict));
    });
    if let Err(e) = spawned {
        let _ = writeln!(log, "rdma-doctor: probe from {from}: no thread for it: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// A door on a free local port whose answer echoes the hello after `hold`, ending
    /// after one probe; its address and the thread that returns its status and log.
    fn door(limits: Limits, hold: Duration) -> (SocketAddr, std::thread::JoinHandle<(i32, String)>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut log = Vec::new();
            let answer = move |mut c: Control, hello: String| {
                std::thread::sleep(hold);
                c.write_all(format!("echo {hello}\n").as_bytes()).map_err(|e| e.to_string())?;
                // The exchange's deadline bounds a client that never ends it.
                let mut rest = Vec::new();
                match c.read_to_end(&mut rest) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                }
            };
            let code = serve(l, &limits, true, answer, &mut log).unwrap();
            (code, String::from_utf8_lossy(&log).into_owned())
        });
        (addr, t)
    }

    fn limits(hello_ms: u64) -> Limits {
        Limits {
            hello: Duration::from_millis(hello_ms),
            exchange: Duration::from_secs(20),
            probes: 2,
            waiting: 8,
            ..Limits::for_timeout(Duration::from_secs(1))
        }
    }

    /// Connects, says `hello`, and reads the first line back (within 10 s).
    fn probe(addr: SocketAddr, hello: &str) -> (TcpStream, String) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("{hello}\n").as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s.try_clone().unwrap()).read_line(&mut line).unwrap();
        (s, line)
    }

    #[test]
    fn an_honest_prober_gets_in_at_once_past_130_silent_connections_and_a_slow_dripper() {
        // A hello time far above the bound checked: a door that queued would fail it.
        let (addr, server) = door(limits(20_000), Duration::ZERO);
        let silent: Vec<TcpStream> = (0..130).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let mut drip = TcpStream::connect(addr).unwrap();
        let dripper = std::thread::spawn(move || {
            // One byte every 2 s, until the door ends.
            for _ in 0..5 {
                if drip.write_all(b"{").is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_secs(2));
            }
            false
        });
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        let (s, line) = probe(addr, "hello");
        assert_eq!(line, "echo hello\n");
        assert!(start.elapsed() < Duration::from_secs(5), "answered in {:?}", start.elapsed());
        drop(s);
        let (code, log) = server.join().unwrap();
        assert_eq!(code, 0, "{log}");
        assert!(log.contains("no hello yet, and 8 connections wait"), "{log}");
        assert!(dripper.join().unwrap(), "the dripper was closed");
        drop(silent);
    }

    #[test]
    fn a_slow_or_silent_client_is_closed_at_the_hello_time_and_a_stalled_probe_at_the_deadline() {
        let mut l = limits(500);
        l.exchange = Duration::from_millis(1_500);
        let (addr, server) = door(l, Duration::ZERO);
        let mut silent = TcpStream::connect(addr).unwrap();
        silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let start = Instant::now();
        assert_eq!(silent.read(&mut [0u8; 8]).unwrap(), 0, "closed");
        assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
        // A client that says hello and then stalls: its probe ends at the exchange's deadline.
        let start = Instant::now();
        let (_stalled, line) = probe(addr, "hello");
        assert_eq!(line, "echo hello\n");
        let (code, log) = server.join().unwrap();
        assert_eq!(code, 1, "{log}");
        assert!(log.contains("no complete hello within"), "{log}");
        assert!(start.elapsed() < Duration::from_secs(5), "{:?} {log}", start.elapsed());
    }

    #[test]
    fn probes_beyond_the_bound_are_told_busy_at_once_not_queued() {
        let (addr, server) = door(limits(3_000), Duration::from_secs(2));
        let first = std::thread::spawn(move || probe(addr, "one"));
        let second = std::thread::spawn(move || probe(addr, "two"));
        std::thread::sleep(Duration::from_millis(500));
        let start = Instant::now();
        let (_s, line) = probe(addr, "three");
        assert!(line.starts_with("BUSY rdma-doctor --serve is answering 2 probes"), "{line}");
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        let (a, la) = first.join().unwrap();
        let (b, lb) = second.join().unwrap();
        assert_eq!((la.as_str(), lb.as_str()), ("echo one\n", "echo two\n"));
        drop((a, b));
        let (code, _) = server.join().unwrap();
        assert_eq!(code, 0);
    }
}
