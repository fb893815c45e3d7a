//! `not_supported`: what a device lacks comes back as `Error::NotSupported`, naming the
//! method or C call that found out and the capability (a device attribute's bit or
//! value, or the errno of a provider without the verb).
//!
//! For XRC, device memory, on-demand paging, dmabuf regions, thread and parent domains,
//! completion timestamps, CQ moderation and null regions, the example asks for the
//! feature and prints one line: `FEATURE: NotSupported: ERROR` when the device lacks it,
//! `FEATURE: supported by this device` when it has it (a device with more than rxe is no
//! failure). Any other outcome is a failure, and the exit code is then 1.
//!
//! ```text
//! scripts/rxe cargo run --example not_supported
//! ```
//!
//! On one device (`RDMA_DEVICE`, else the first); rxe of Linux 6.1 lacks every one.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

#[path = "common/area.rs"]
mod area;
use area::AnyError;

use rdma_verbs::{
    AccessFlags, AlignedBuf, CompletionQueue, DeviceMemory, Error, Local, ParentDomain, ProtectionDomain, ThreadDomain,
    Verb, WcFields, XrcDomain,
};

/// What asking for a feature gave.
enum Outcome {
    /// The device has it.
    Supported,
    /// The device has it, and says so in another way than success (the detail says how).
    SupportedBecause(String),
    /// A failure: anything but a typed NotSupported or the feature itself.
    Failed(Error),
    /// The typed refusal.
    NotSupported(Error),
}

fn outcome<T>(r: rdma_verbs::Result<T>) -> Outcome {
    match r {
        Ok(_) => Outcome::Supported,
        Err(e @ Error::NotSupported { .. }) => Outcome::NotSupported(e),
        Err(e) => Outcome::Failed(e),
    }
}

/// A dmabuf region over a memfd: a provider without dmabuf regions refuses the call; one
/// with them passes it to the kernel, which refuses the memfd (it is no dma-buf).
fn dmabuf(pd: &ProtectionDomain) -> Result<Outcome, AnyError> {
    // SAFETY: a NUL-terminated name and no flags.
    let fd = unsafe { libc::memfd_create(c"not_supported".as_ptr(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: the descriptor just created, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the memfd just created.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(match outcome(pd.register_dmabuf(fd, 0, 4096, 0, AccessFlags::LOCAL_WRITE)) {
        Outcome::Failed(e) if e.verb_of() == Some(Verb::RegDmabufMr) => {
            Outcome::SupportedBecause(format!("the provider has reg_dmabuf_mr; the kernel refused a memfd: {e}"))
        }
        other => other,
    })
}

fn main() -> Result<(), AnyError> {
    let ctx = area::open()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut cq = CompletionQueue::new(&ctx, 16)?;
    let features: Vec<(&str, Outcome)> = vec![
        ("XRC domains", outcome(XrcDomain::open(&ctx, None, libc::O_CREAT))),
        ("device memory", outcome(DeviceMemory::alloc(&ctx, 4096, 3))),
        (
            "on-demand paging",
            outcome(pd.register_on_demand::<_, Local>(AlignedBuf::new(4096)?, AccessFlags::LOCAL_WRITE)),
        ),
        ("dmabuf regions", dmabuf(&pd)?),
        ("thread domains", outcome(ThreadDomain::alloc(&ctx))),
        ("parent domains", outcome(ParentDomain::new(&pd, None))),
        (
            "completion timestamps",
            outcome(CompletionQueue::builder(&ctx, 16).extended(WcFields::COMPLETION_TIMESTAMP).build()),
        ),
        ("CQ moderation", outcome(cq.set_moderation(16, 10))),
        ("null regions", outcome(pd.alloc_null_region())),
    ];
    let mut failed = 0;
    for (feature, outcome) in features {
        match outcome {
            Outcome::NotSupported(e) => println!("{feature}: NotSupported: {e}"),
            Outcome::Supported => println!("{feature}: supported by this device"),
            Outcome::SupportedBecause(why) => println!("{feature}: supported by this device ({why})"),
            Outcome::Failed(e) => {
                println!("{feature}: FAILED, not a typed NotSupported: {e}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} features failed otherwise than with NotSupported").into());
    }
    Ok(())
}
