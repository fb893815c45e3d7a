//! Shared by the probes that scripts/instructions and scripts/scale count with callgrind
//! (`#[path]`-included by examples/syscall_probe.rs and examples/scale_probe.rs).

/// Starts callgrind's instrumentation (CALLGRIND_START_INSTRUMENTATION of valgrind's
/// callgrind.h, a client request); outside Valgrind these instructions change nothing.
/// scripts/instructions runs callgrind with `--instr-atstart=no`, so that loading the
/// libraries and the setup, the same in every run, run uninstrumented, which is faster.
#[inline(never)]
pub fn start_instrumentation() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // VG_USERREQ_TOOL_BASE('C', 'T') + 4, and its five arguments.
        let request: [u64; 6] = [(u64::from(b'C') << 24 | u64::from(b'T') << 16) + 4, 0, 0, 0, 0, 0];
        // SAFETY: valgrind.h's client request for amd64: rdi rotated by 3 + 13 + 61 + 51 =
        // 128 bits (unchanged), then `xchg rbx, rbx` (unchanged); Valgrind reads the request
        // at rax and answers in rdx. Natively only the flags change.
        unsafe {
            std::arch::asm!(
                "rol rdi, 3", "rol rdi, 13", "rol rdi, 61", "rol rdi, 51", "xchg rbx, rbx",
                in("rax") request.as_ptr(),
                inout("rdx") 0u64 => _,
                inout("rdi") 0u64 => _,
            );
        }
    }
}
