//! The example tools (and other programs, perftest's among them) run as the user runs
//! them, in child processes on the device: their output collected, a server's stderr
//! watched for the line that says it listens, every run bounded in time.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::example;

/// A run never takes this long, even when the first start of a debug binary from the
/// shared folder takes seconds under emulation.
pub const LIMIT: Duration = Duration::from_secs(180);

/// A child process whose stderr lines arrive on a channel as they come (a server says
/// there when it listens).
pub struct Proc {
    name: String,
    child: Child,
    err_lines: mpsc::Receiver<String>,
    err: Vec<String>,
    out: thread::JoinHandle<String>,
}

/// What a finished child printed.
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// All it printed on stdout.
    pub stdout: String,
    /// All it printed on stderr.
    pub stderr: String,
}

impl Finished {
    /// Everything, for a failed assertion.
    pub fn report(&self, name: &str) -> String {
        format!("--- {name}: {}\n--- stdout:\n{}--- stderr:\n{}", self.status, self.stdout, self.stderr)
    }
}

impl Proc {
    /// Starts the example tool `name` with `args`.
    pub fn spawn(name: &str, args: &[String]) -> Proc {
        Self::spawn_program(&example(name), name, args)
    }

    /// Starts the program at `path` (or found in `PATH`), called `name` in messages.
    pub fn spawn_program(path: &Path, name: &str, args: &[String]) -> Proc {
        let mut child = Command::new(path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", path.display()));
        let (tx, err_lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stdout = child.stdout.take().unwrap();
        let out = thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        Proc { name: format!("{name} {}", args.join(" ")), child, err_lines, err: Vec::new(), out }
    }

    /// Waits until a stderr line contains `needle`.
    pub fn wait_stderr(&mut self, needle: &str) {
        let deadline = Instant::now() + LIMIT;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.err_lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.err.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("{}: no stderr line with {needle:?}; stderr:\n{}", self.name, self.err.join("\n"));
    }

    /// Waits for the exit (killed after [`LIMIT`]) and collects the output.
    pub fn finish(mut self) -> Finished {
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break self.child.wait().unwrap();
            }
            thread::sleep(Duration::from_millis(20));
        };
        let stdout = self.out.join().unwrap_or_default();
        // The reader thread ends with the pipe; take what it read.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = self.err_lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            self.err.push(line);
        }
        Finished { status, stdout, stderr: self.err.join("\n") + "\n" }
    }
}

/// Runs one process to its end.
pub fn run(name: &str, args: &[String]) -> Finished {
    Proc::spawn(name, args).finish()
}

/// A program by name: `ib_*` is perftest's (found in `PATH`), anything else an example
/// tool of this workspace.
fn spawn_any(name: &str, args: &[String]) -> Proc {
    if name.starts_with("ib_") {
        Proc::spawn_program(Path::new(name), name, args)
    } else {
        Proc::spawn(name, args)
    }
}

/// A server and its client in perftest's rdma_cm mode (`-R`), each `(program, args)`
/// (`ib_*` is perftest's, found in `PATH`); the client's args end with the server's
/// address. The client starts once our server says it listens (perftest's client gives up
/// at once on a port where nothing listens); a perftest server says nothing on stderr,
/// and our client tries again while nothing listens.
pub fn cm_pair(server: (&str, &[String]), client: (&str, &[String])) -> (Finished, Finished) {
    let mut s = spawn_any(server.0, server.1);
    if !server.0.starts_with("ib_") {
        s.wait_stderr("waiting for an rdma_cm client");
    }
    let c = spawn_any(client.0, client.1).finish();
    (s.finish(), c)
}

/// The fields of the result row of a bandwidth table (ours or perftest's) for `bytes`
/// and `iters`: the line whose first two fields are those.
pub fn bw_row(stdout: &str, bytes: u64, iters: u64) -> Option<Vec<f64>> {
    stdout.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let ok = f.len() >= 5 && f[0] == bytes.to_string() && f[1] == iters.to_string();
        ok.then(|| f[2..].iter().filter_map(|x| x.parse().ok()).collect())
    })
}

/// write_bw's rdma_cm mode on the device under test (`-R`, the server on `RDMA_IP`, TCP
/// port space port `port`): against itself on 2 QPs with the data check, then against
/// perftest's `ib_write_bw -R` in both roles (4 KiB x 200 each). Panics with both sides'
/// output on any failure.
pub fn write_bw_over_rdma_cm_meets_itself_and_perftest(port: u16) {
    let (dev, ip) = (crate::device_name(), crate::rdma_ip().to_string());
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let port = port.to_string();
    let ours = strings(&["-R", "-s", "4096", "-n", "200", "-p", &port]);
    let theirs = strings(&["-R", "-d", &dev, "-F", "-s", "4096", "-n", "200", "-p", &port]);
    let with = |mut v: Vec<String>, more: &[&str]| {
        v.extend(strings(more));
        v
    };
    let fine = |f: &Finished, what: &str| assert!(f.status.success(), "{what} failed\n{}", f.report(what));
    // perftest's own figures may be 0 under emulation (its clock calibration fails
    // there: "Correlation coefficient r^2 < 0.9"): its row must be there, ours positive.
    let has_row = |f: &Finished, what: &str| {
        let row =
            bw_row(&f.stdout, 4096, 200).unwrap_or_else(|| panic!("{what}: no 4096 x 200 row\n{}", f.report(what)));
        let ours = !what.starts_with("ib_");
        assert!(row.len() >= 3, "{what}: a row of 5 fields\n{}", f.report(what));
        assert!(!ours || row.iter().all(|&x| x > 0.0), "{what}: bandwidth and rate > 0\n{}", f.report(what));
    };

    // Ours against ours, 2 QPs: the server checks both regions and says so.
    let (s, c) =
        cm_pair(("write_bw", &with(ours.clone(), &["-q", "2"])), ("write_bw", &with(ours.clone(), &["-q", "2", &ip])));
    fine(&s, "write_bw -R server");
    fine(&c, "write_bw -R client");
    assert!(s.stderr.contains("4096 B: the data check passed on 2 QPs"), "no data check\n{}", s.report("server"));
    has_row(&c, "write_bw -R client");

    // Our server, perftest's client: perftest prints its table, ours the client's report.
    let (s, c) = cm_pair(("write_bw", &ours), ("ib_write_bw", &with(theirs.clone(), &[&ip])));
    fine(&s, "write_bw -R server");
    fine(&c, "ib_write_bw -R client");
    assert!(s.stderr.contains("the peer is perftest"), "perftest not recognised\n{}", s.report("server"));
    has_row(&c, "ib_write_bw -R client");

    // perftest's server, our client.
    let (s, c) = cm_pair(("ib_write_bw", &theirs), ("write_bw", &with(ours, &[&ip])));
    fine(&s, "ib_write_bw -R server");
    fine(&c, "write_bw -R client");
    assert!(c.stderr.contains("the peer is perftest"), "perftest not recognised\n{}", c.report("client"));
    has_row(&c, "write_bw -R client");
    has_row(&s, "ib_write_bw -R server");
}
