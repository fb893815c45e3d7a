//! What libibverbs prints while it lists and opens devices. It tells why a provider did
//! not load (`libibverbs: Warning: couldn't load driver 'libmlx5-rdmav34.so': ...`) only on
//! stderr, and only on the first listing that finds a device no provider claims; so the
//! doctor points fd 2 at an anonymous file (memfd) for the duration of its own listing and
//! opening, then reads the text back and restores fd 2.
//!
//! A file, not a pipe: nothing has to read while libibverbs writes, so any amount of output
//! is safe; only the first [`MAX_CAPTURE`] bytes are read back. C's `stderr` is unbuffered,
//! so every byte is in the file when the closure returns. While fd 2 is redirected, other
//! threads' stderr goes to the file too; the command runs this single-threaded.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The most bytes of captured text kept.
pub const MAX_CAPTURE: u64 = 64 << 10;

/// Puts fd 2 back when dropped (also when `f` unwinds).
struct Restore(Option<OwnedFd>);

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(saved) = self.0.take() {
            // SAFETY: `saved` is an open descriptor we own; dup2 onto 2 only replaces fd 2.
            unsafe { libc::dup2(saved.as_raw_fd(), 2) };
        }
    }
}

/// Runs `f` with fd 2 pointed at a fresh file and returns what was written there (lossy
/// UTF-8, at most [`MAX_CAPTURE`] bytes). When the file cannot be made, `f` runs with
/// stderr untouched and the text is empty.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    let Some((mut file, guard)) = redirect() else { return (f(), String::new()) };
    let out = f();
    drop(guard);
    let mut bytes = Vec::new();
    let read = file.seek(SeekFrom::Start(0)).and_then(|_| (&mut file).take(MAX_CAPTURE).read_to_end(&mut bytes));
    if read.is_err() {
        bytes.clear();
    }
    (out, String::from_utf8_lossy(&bytes).into_owned())
}

fn redirect() -> Option<(File, Restore)> {
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let mem = unsafe { libc::memfd_create(c"rdma-doctor-stderr".as_ptr(), libc::MFD_CLOEXEC) };
    if mem < 0 {
        return None;
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(mem) };
    // SAFETY: F_DUPFD_CLOEXEC on fd 2 makes a new descriptor or fails; checked below.
    let saved = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
    if saved < 0 {
        return None;
    }
    // SAFETY: `saved` is the new descriptor fcntl just returned, owned here only.
    let guard = Restore(Some(unsafe { OwnedFd::from_raw_fd(saved) }));
    // SAFETY: both descriptors are open; dup2 replaces fd 2 atomically.
    if unsafe { libc::dup2(file.as_raw_fd(), 2) } < 0 {
        return None;
    }
    Some((file, guard))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fd 2 is one per process: the tests that redirect it take turns.
    static FD2: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn write_fd2(text: &str) {
        // SAFETY: a valid buffer of that length.
        unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
    }

    #[test]
    fn what_c_code_writes_to_fd_2_is_captured_and_fd_2_is_restored() {
        let _turn = FD2.lock().unwrap_or_else(|e| e.into_inner());
        let (value, text) = capture(|| {
            write_fd2("libibverbs: Warning: couldn't load driver 'libmlx5-rdmav34.so': not found\n");
            7
        });
        assert_eq!(value, 7);
        assert_eq!(text, "libibverbs: Warning: couldn't load driver 'libmlx5-rdmav34.so': not found\n");
        // Restored: a second capture starts empty and fd 2 is still a valid descriptor.
        let ((), again) = capture(|| {});
        assert_eq!(again, "");
        // SAFETY: F_GETFD only queries.
        assert!(unsafe { libc::fcntl(2, libc::F_GETFD) } >= 0);
    }

    #[test]
    fn a_flood_is_cut_at_the_limit_without_blocking() {
        let _turn = FD2.lock().unwrap_or_else(|e| e.into_inner());
        let ((), text) = capture(|| {
            let line = "x".repeat(4096);
            for _ in 0..64 {
                write_fd2(&line);
            }
        });
        assert_eq!(text.len() as u64, MAX_CAPTURE);
    }
}
