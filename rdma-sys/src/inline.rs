//! The `static inline` verbs of `<infiniband/verbs.h>`, ported to Rust.
//!
//! These functions have no symbol in libibverbs: C code compiles them into the
//! caller, where they load a function pointer from the provider's op table and
//! call it. Each port here has the C name and signature and does the same thing,
//! with no C shim and no call in between, so `ibv_post_send` costs what it costs
//! in C: one load and one indirect call.
//!
//! # Where a function pointer may be null
//!
//! The C inlines call most ops without looking. The ports never call a null
//! pointer; what they do instead depends on who fills the pointer:
//!
//! - `ibv_context::ops` (`poll_cq`, `post_send`, `post_recv`, `post_srq_recv`,
//!   `req_notify_cq`, `bind_mw`, `dealloc_mw`): libibverbs fills every slot
//!   with a stub returning `EOPNOTSUPP` before the provider installs its own, so
//!   they are never null on a context from `ibv_open_device`. The ports still
//!   match on the `Option` and return that same `EOPNOTSUPP` (negated for
//!   `ibv_poll_cq`, where a positive value would be a completion count).
//! - `verbs_context` ops: reached through [`verbs_get_ctx_op`], as in C, which
//!   also checks that the provider's context is large enough to have the field.
//! - `ibv_qp_ex::wr_*` and `ibv_cq_ex::read_*`: the provider sets them only for
//!   the operations and fields requested at creation (`send_ops_flags`,
//!   `wc_flags`). Calling one that was not requested is a bug the C inline turns
//!   into a jump to address 0; the ports panic with the op's name instead (or
//!   return `EOPNOTSUPP` where the op returns an error code). The check is one
//!   predictable branch.
//!
//! `ibv_cq_ex_to_cq`, `ibv_inc_rkey`, `ibv_is_qpt_supported` and
//! `ibv_flow_label_to_udp_sport` only cast or compute, so they are safe `const fn`s.
//!
//! # Not ported, and why
//!
//! - `ibv_qp_to_qp_ex` is exported by libibverbs and is in the bindings.
//! - `ibv_reg_mr` and `ibv_reg_mr_iova` are macros that pick between exported
//!   symbols (`ibv_reg_mr`/`ibv_reg_mr_iova` or `ibv_reg_mr_iova2`) depending on
//!   whether an optional access flag is set; the bindings expose all of them.
//! - `__ibv_get_device_list` only serves static linking of providers.
//! - `ibv_query_port` is ported under its C name; the exported symbol of that
//!   name, which fills the old port attribute layout, is
//!   [`ibv_query_port_compat`].

use core::ffi::{c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};
use core::ptr::{self, null_mut};

use crate::bindings::*;
use crate::{ibv_query_port_compat, VERBS_ABI_IS_EXTENDED};

/// Sets the calling thread's `errno`, as the C inlines do before returning NULL.
#[inline]
fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = value };
}

/// Where an op the caller asked for at creation time is missing: a caller bug.
#[cold]
#[inline(never)]
#[track_caller]
fn missing_op(op: &str) -> ! {
    panic!(
        "the provider did not set `{op}`: the QP or CQ was created without the \
         send_ops_flags/wc_flags bit that enables it"
    )
}

/// Reads op `$op` of the `verbs_context` behind `$ctx` as an `Option`, or `None`
/// when [`verbs_get_ctx_op`] says the provider does not have it. Expands to
/// unsafe operations: use inside an `unsafe` block whose caller holds a live context.
macro_rules! vctx_op {
    ($ctx:expr, $op:ident) => {{
        let vctx = verbs_get_ctx_op($ctx, offset_of!(verbs_context, $op));
        if vctx.is_null() {
            None
        } else {
            read_vctx_field(vctx, offset_of!(verbs_context, $op), |v| &v.$op)
        }
    }};
}

// `verbs_get_ctx_op` reads `sz` right before `context`, where every extended context has it.
const _: () = assert!(offset_of!(verbs_context, sz) + size_of::<usize>() == offset_of!(verbs_context, context));

/// Reads the field at byte `offset` of the `verbs_context` at `vctx`; `field` only
/// names its type. Plain pointer arithmetic, without claiming that the whole struct
/// is in bounds: a library older than these bindings has a smaller context, which
/// starts after `vctx`.
///
/// # Safety
///
/// The field must lie inside the live context (`sz` says how far back it reaches).
#[inline(always)]
unsafe fn read_vctx_field<T: Copy>(vctx: *mut verbs_context, offset: usize, field: fn(&verbs_context) -> &T) -> T {
    let _ = field;
    // SAFETY: the caller checked that the field is inside the live context; fields of
    // a repr(C) struct at their offset are aligned.
    unsafe { vctx.wrapping_byte_add(offset).cast::<T>().read() }
}

// ---------------------------------------------------------------------------
// The extended context
// ---------------------------------------------------------------------------

/// Returns the `verbs_context` that embeds `ctx`, or null when the context is not
/// an extended one (`abi_compat` is not [`VERBS_ABI_IS_EXTENDED`]).
///
/// When libibverbs at run time is older than the headers these bindings came from,
/// its context is smaller and starts after the returned address: read only the
/// fields that `sz` covers (see [`verbs_get_ctx_op`]).
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context` (from `ibv_open_device`).
#[inline]
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: the caller passes a live context, so its fields can be read.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return null_mut();
    }
    // An extended context is the last field of a `verbs_context`: step back to its start,
    // as C's container_of does (wrapping: see above for when that is outside the allocation).
    ctx.wrapping_byte_sub(offset_of!(verbs_context, context)).cast::<verbs_context>()
}

/// The `verbs_get_ctx_op` macro: returns the `verbs_context` behind `ctx` if it
/// is extended, is large enough to contain the op at byte offset `op_offset`, and
/// that op is set; null otherwise.
///
/// Pass `core::mem::offset_of!(verbs_context, op)`. The context grows towards
/// lower addresses (new ops are added at the front), so a provider built against
/// older headers has a smaller `sz` and lacks the ops at the lowest offsets.
///
/// # Safety
///
/// `ctx` must point to a live `ibv_context`, and `op_offset` must be the offset of
/// a function-pointer field of `verbs_context`.
#[inline]
pub unsafe fn verbs_get_ctx_op(ctx: *mut ibv_context, op_offset: usize) -> *mut verbs_context {
    // SAFETY: forwarded from the caller: `ctx` is live.
    let vctx = unsafe { verbs_get_ctx(ctx) };
    if vctx.is_null() {
        return null_mut();
    }
    // SAFETY: `sz` sits right before `context` (checked at compile time above), so every
    // extended context has it.
    let sz = unsafe { read_vctx_field(vctx, offset_of!(verbs_context, sz), |v| &v.sz) };
    if sz < size_of::<verbs_context>() - op_offset {
        return null_mut();
    }
    // SAFETY: the size check shows the provider's context covers this field, and the
    // caller promises it is a function pointer (null when the op is absent).
    let op = unsafe { vctx.wrapping_byte_add(op_offset).cast::<*const c_void>().read() };
    if op.is_null() {
        null_mut()
    } else {
        vctx
    }
}

// ---------------------------------------------------------------------------
// Device and port
// ---------------------------------------------------------------------------

/// Queries port `port_num` into `port_attr` (the current layout): the C
/// `ibv_query_port` macro. Falls back to the exported compat symbol, after
/// zeroing `port_attr`, when the context has no `query_port` op.
///
/// Returns 0 or an errno value.
///
/// # Safety
///
/// `context` must be a live context and `port_attr` valid for writing one
/// `ibv_port_attr`.
#[doc(alias = "___ibv_query_port")]
#[inline]
pub unsafe fn ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut ibv_port_attr) -> c_int {
    // SAFETY: `context` is live (caller's contract); the op is called with the size of
    // the struct the caller gave us, which is what it uses to know how much to fill.
    unsafe {
        match vctx_op!(context, query_port) {
            Some(query_port) => query_port(context, port_num, port_attr, size_of::<ibv_port_attr>()),
            None => {
                ptr::write_bytes(port_attr, 0, 1);
                ibv_query_port_compat(context, port_num, port_attr.cast::<_compat_ibv_port_attr>())
            }
        }
    }
}

/// Reads GID table entry `gid_index` of `port_num` into `entry`.
///
/// # Safety
///
/// `context` must be live and `entry` valid for writing one `ibv_gid_entry`.
#[inline]
pub unsafe fn ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
) -> c_int {
    // SAFETY: forwarded contract; the size tells the library how large `entry` is.
    unsafe { _ibv_query_gid_ex(context, port_num, gid_index, entry, flags, size_of::<ibv_gid_entry>()) }
}

/// Reads up to `max_entries` valid GID entries of all ports into `entries`;
/// returns how many, or a negative errno.
///
/// # Safety
///
/// `context` must be live and `entries` valid for writing `max_entries` entries.
#[inline]
pub unsafe fn ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
) -> isize {
    // SAFETY: forwarded contract; the size tells the library the stride of `entries`.
    unsafe { _ibv_query_gid_table(context, entries, max_entries, flags, size_of::<ibv_gid_entry>()) }
}

/// Queries the extended device attributes, falling back to `ibv_query_device`
/// (with the rest of `attr` zeroed) when the provider cannot.
///
/// Returns 0 or an errno value; `EINVAL` if `input` has a non-zero `comp_mask`.
///
/// # Safety
///
/// `context` must be live, `input` null or valid for reading, and `attr` valid
/// for writing one `ibv_device_attr_ex`.
#[inline]
pub unsafe fn ibv_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: `input` is null or readable (caller's contract).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: `context` is live; the op gets the size of the caller's `attr`.
    let ret = unsafe {
        match vctx_op!(context, query_device_ex) {
            Some(query) => query(context, input, attr, size_of::<ibv_device_attr_ex>()),
            None => libc::EOPNOTSUPP,
        }
    };
    if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
        return ret;
    }
    // SAFETY: `attr` is writable (caller's contract), and `orig_attr` is inside it.
    unsafe {
        ptr::write_bytes(attr, 0, 1);
        ibv_query_device(context, ptr::addr_of_mut!((*attr).orig_attr))
    }
}

/// Reads the device's real-time values (for example its raw clock) into `values`.
///
/// # Safety
///
/// `context` must be live and `values` valid for reading and writing.
#[inline]
pub unsafe fn ibv_query_rt_values_ex(context: *mut ibv_context, values: *mut ibv_values_ex) -> c_int {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    unsafe {
        match vctx_op!(context, query_rt_values) {
            Some(query) => query(context, values),
            None => libc::EOPNOTSUPP,
        }
    }
}

// ---------------------------------------------------------------------------
// Protection domains, thread domains, memory
// ---------------------------------------------------------------------------

/// Allocates a thread domain; null with `errno` set on failure.
///
/// # Safety
///
/// `context` must be live and `init_attr` valid for reading.
#[inline]
pub unsafe fn ibv_alloc_td(context: *mut ibv_context, init_attr: *mut ibv_td_init_attr) -> *mut ibv_td {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, alloc_td) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(alloc) => unsafe { alloc(context, init_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Frees a thread domain; returns 0 or an errno value.
///
/// # Safety
///
/// `td` must be a live thread domain with no users left.
#[inline]
pub unsafe fn ibv_dealloc_td(td: *mut ibv_td) -> c_int {
    // SAFETY: `td` is live, so its context is too.
    unsafe {
        match vctx_op!((*td).context, dealloc_td) {
            Some(dealloc) => dealloc(td),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Allocates a parent domain over a PD (and optionally a TD); null with `errno`
/// set on failure.
///
/// # Safety
///
/// `context` must be live and `attr` valid for reading.
#[inline]
pub unsafe fn ibv_alloc_parent_domain(
    context: *mut ibv_context,
    attr: *mut ibv_parent_domain_init_attr,
) -> *mut ibv_pd {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, alloc_parent_domain) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(alloc) => unsafe { alloc(context, attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Gives the provider advice (such as prefetch) about ranges of ODP memory regions.
///
/// # Safety
///
/// `pd` must be live and `sg_list` valid for reading `num_sge` entries.
#[inline]
pub unsafe fn ibv_advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: `pd` is live, so its context is too.
    unsafe {
        match vctx_op!((*pd).context, advise_mr) {
            Some(advise) => advise(pd, advice, flags, sg_list, num_sge),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Allocates device memory; null with `errno` set on failure.
///
/// # Safety
///
/// `context` must be live and `attr` valid for reading.
#[inline]
pub unsafe fn ibv_alloc_dm(context: *mut ibv_context, attr: *mut ibv_alloc_dm_attr) -> *mut ibv_dm {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, alloc_dm) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(alloc) => unsafe { alloc(context, attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Frees device memory; returns 0 or an errno value.
///
/// # Safety
///
/// `dm` must be live device memory with no memory region left on it.
#[inline]
pub unsafe fn ibv_free_dm(dm: *mut ibv_dm) -> c_int {
    // SAFETY: `dm` is live, so its context is too.
    unsafe {
        match vctx_op!((*dm).context, free_dm) {
            Some(free) => free(dm),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Copies `length` bytes from host memory into device memory at `dm_offset`.
///
/// # Safety
///
/// `dm` must be live and `host_addr` valid for reading `length` bytes.
#[inline]
pub unsafe fn ibv_memcpy_to_dm(dm: *mut ibv_dm, dm_offset: u64, host_addr: *const c_void, length: usize) -> c_int {
    // SAFETY: `dm` is live; its copy op is the provider's, set at allocation.
    unsafe {
        match (*dm).memcpy_to_dm {
            Some(copy) => copy(dm, dm_offset, host_addr, length),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Copies `length` bytes from device memory at `dm_offset` into host memory.
///
/// # Safety
///
/// `dm` must be live and `host_addr` valid for writing `length` bytes.
#[inline]
pub unsafe fn ibv_memcpy_from_dm(host_addr: *mut c_void, dm: *mut ibv_dm, dm_offset: u64, length: usize) -> c_int {
    // SAFETY: `dm` is live; its copy op is the provider's, set at allocation.
    unsafe {
        match (*dm).memcpy_from_dm {
            Some(copy) => copy(host_addr, dm, dm_offset, length),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Allocates a memory region whose accesses are dropped; null with `errno` set
/// on failure.
///
/// # Safety
///
/// `pd` must be live.
#[inline]
pub unsafe fn ibv_alloc_null_mr(pd: *mut ibv_pd) -> *mut ibv_mr {
    // SAFETY: `pd` is live, so its context is too.
    match unsafe { vctx_op!((*pd).context, alloc_null_mr) } {
        // SAFETY: the provider's op with the caller's PD, as in C.
        Some(alloc) => unsafe { alloc(pd) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Registers device memory as a memory region; null with `errno` set on failure.
///
/// # Safety
///
/// `pd` and `dm` must be live and belong to the same context.
#[inline]
pub unsafe fn ibv_reg_dm_mr(
    pd: *mut ibv_pd,
    dm: *mut ibv_dm,
    dm_offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    // SAFETY: `pd` is live, so its context is too.
    match unsafe { vctx_op!((*pd).context, reg_dm_mr) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(reg) => unsafe { reg(pd, dm, dm_offset, length, access) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Allocates a memory window of `type_`; null with `errno` set on failure
/// (`EOPNOTSUPP` when the provider has no windows).
///
/// # Safety
///
/// `pd` must be live.
#[inline]
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type) -> *mut ibv_mw {
    // SAFETY: `pd` is live, so its context and the context's op table are too.
    match unsafe { (*(*pd).context).ops.alloc_mw } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(alloc) => unsafe { alloc(pd, type_) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Frees a memory window; returns 0 or an errno value.
///
/// # Safety
///
/// `mw` must be a live memory window.
#[inline]
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: `mw` is live, so its context is. libibverbs fills this slot with a stub
    // before the provider's ops, so `None` only happens on a context it did not make;
    // there we return what its stub returns.
    unsafe {
        match (*(*mw).context).ops.dealloc_mw {
            Some(dealloc) => dealloc(mw),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Increments the 8-bit key part of `rkey`, wrapping, for binding a type 1
/// memory window again.
#[inline]
pub const fn ibv_inc_rkey(rkey: u32) -> u32 {
    const MASK: u32 = 0xff;
    (rkey & !MASK) | (rkey.wrapping_add(1) & MASK)
}

/// Binds a type 1 memory window to a memory region by posting a bind on `qp`.
///
/// Returns 0 or an errno value: `EINVAL` for a type 2 window or an empty
/// `mr` with a non-empty range, `EPERM` when the MR's PD is not the window's.
///
/// # Safety
///
/// `qp` and `mw` must be live, `mw_bind` valid for reading, and its MR (if any)
/// live.
#[inline]
pub unsafe fn ibv_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int {
    // SAFETY: all three pointers are live or readable (caller's contract), and so is the
    // MR they name. The op slot is always filled by libibverbs (see `ibv_dealloc_mw`).
    unsafe {
        let bind_info = &(*mw_bind).bind_info;
        if (*mw).type_ != ibv_mw_type::IBV_MW_TYPE_1 {
            return libc::EINVAL;
        }
        if bind_info.mr.is_null() && (bind_info.addr != 0 || bind_info.length != 0) {
            return libc::EINVAL;
        }
        if !bind_info.mr.is_null() && (*mw).pd != (*bind_info.mr).pd {
            return libc::EPERM;
        }
        match (*(*mw).context).ops.bind_mw {
            Some(bind) => bind(qp, mw, mw_bind),
            None => libc::EOPNOTSUPP,
        }
    }
}

// ---------------------------------------------------------------------------
// Completion queues
// ---------------------------------------------------------------------------

/// Creates an extended CQ; null with `errno` set on failure. The op is
/// libibverbs' own, which refuses unknown `wc_flags` (`EOPNOTSUPP`) before calling
/// the provider; the rdma-core 44 header checks nothing itself (older headers
/// refused unknown `comp_mask` bits here).
///
/// # Safety
///
/// `context` must be live and `cq_attr` valid for reading and writing.
#[inline]
pub unsafe fn ibv_create_cq_ex(context: *mut ibv_context, cq_attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, create_cq_ex) } {
        // SAFETY: the library's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(context, cq_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Views an extended CQ as a plain CQ (for `ibv_poll_cq`, `ibv_destroy_cq`, ...).
/// Only a cast, so it is safe: the plain CQ is the extended CQ's prefix.
#[inline]
pub const fn ibv_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    cq.cast::<ibv_cq>()
}

/// Polls up to `num_entries` completions into `wc`. Returns how many (0 when the
/// CQ is empty) or a negative value on error.
///
/// # Safety
///
/// `cq` must be a live CQ and `wc` valid for writing `num_entries` entries.
#[inline]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: `cq` is live, so its context is. libibverbs fills every slot of
    // `ibv_context::ops` with a stub before the provider's ops, so `None` only happens
    // on a context it did not make; there we report an error (negative: a positive
    // value would read as a completion count).
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(poll) => poll(cq, num_entries, wc),
            None => -libc::EOPNOTSUPP,
        }
    }
}

/// Arms the CQ so the next completion (or next solicited one, if
/// `solicited_only` is non-zero) raises an event on its completion channel.
/// Returns 0 or an errno value.
///
/// # Safety
///
/// `cq` must be a live CQ.
#[inline]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: `cq` is live, so its context is; the slot is always filled by
    // libibverbs (see `ibv_poll_cq`), and the fallback is what its stub returns.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(notify) => notify(cq, solicited_only),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Changes CQ attributes such as moderation; returns 0 or an errno value.
///
/// # Safety
///
/// `cq` must be a live CQ and `attr` valid for reading.
#[inline]
pub unsafe fn ibv_modify_cq(cq: *mut ibv_cq, attr: *mut ibv_modify_cq_attr) -> c_int {
    // SAFETY: `cq` is live, so its context is too.
    unsafe {
        match vctx_op!((*cq).context, modify_cq) {
            Some(modify) => modify(cq, attr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Starts a polling batch on an extended CQ: on success (0) the first
/// completion's `status` and `wr_id` are in `cq` and its other fields can be read
/// with the `ibv_wc_read_*` functions. Returns `ENOENT` when the CQ is empty
/// (and no batch is open), another errno value on error.
///
/// # Safety
///
/// `cq` must be a live extended CQ, `attr` valid for reading, and no batch open
/// on it. After 0, the batch must be closed with [`ibv_end_poll`].
#[inline]
pub unsafe fn ibv_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    // SAFETY: `cq` is live; the provider installs this op on every extended CQ.
    unsafe {
        match (*cq).start_poll {
            Some(start) => start(cq, attr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Moves to the next completion of the open batch: 0, or `ENOENT` when there is
/// none (the batch stays open until [`ibv_end_poll`]).
///
/// # Safety
///
/// `cq` must be a live extended CQ with an open batch.
#[inline]
pub unsafe fn ibv_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: `cq` is live; the provider installs this op on every extended CQ.
    unsafe {
        match (*cq).next_poll {
            Some(next) => next(cq),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Closes the batch opened by a successful [`ibv_start_poll`].
///
/// # Safety
///
/// `cq` must be a live extended CQ with an open batch.
///
/// # Panics
///
/// If the provider has no `end_poll` op.
#[inline]
pub unsafe fn ibv_end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: `cq` is live; the provider installs this op on every extended CQ.
    unsafe {
        match (*cq).end_poll {
            Some(end) => end(cq),
            None => missing_op("end_poll"),
        }
    }
}

/// Generates the `ibv_wc_read_*` accessors: each calls one `read_*` op of the
/// extended CQ for the current completion of an open batch.
macro_rules! wc_readers {
    ($( $(#[$doc:meta])* $name:ident => $op:ident -> $ret:ty $(, $flag:literal)?; )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// `cq` must be a live extended CQ with an open polling batch
        /// ([`ibv_start_poll`] returned 0) and a current completion.
        ///
        /// # Panics
        ///
        #[doc = concat!("If the provider left `", stringify!($op), "` unset.")]
        $(#[doc = concat!(
            "Providers set it only on CQs created with `", $flag, "` in `wc_flags`."
        )])?
        #[inline]
        pub unsafe fn $name(cq: *mut ibv_cq_ex) -> $ret {
            // SAFETY: `cq` is live with a current completion (caller's contract); the op
            // is the provider's reader for it, called as the C inline does.
            unsafe {
                match (*cq).$op {
                    Some(read) => read(cq),
                    None => missing_op(stringify!($op)),
                }
            }
        }
    )*};
}

wc_readers! {
    /// The completion's opcode.
    ibv_wc_read_opcode => read_opcode -> ibv_wc_opcode;
    /// The vendor error syndrome of a failed completion.
    ibv_wc_read_vendor_err => read_vendor_err -> u32;
    /// The number of bytes received.
    ibv_wc_read_byte_len => read_byte_len -> u32, "IBV_WC_EX_WITH_BYTE_LEN";
    /// The immediate data, in network byte order.
    ibv_wc_read_imm_data => read_imm_data -> __be32, "IBV_WC_EX_WITH_IMM";
    /// The rkey invalidated by a send with invalidate (shares the immediate's slot).
    ibv_wc_read_invalidated_rkey => read_imm_data -> u32, "IBV_WC_EX_WITH_IMM";
    /// The local QP number the completion belongs to.
    ibv_wc_read_qp_num => read_qp_num -> u32, "IBV_WC_EX_WITH_QP_NUM";
    /// The remote QP number (UD).
    ibv_wc_read_src_qp => read_src_qp -> u32, "IBV_WC_EX_WITH_SRC_QP";
    /// The completion's `ibv_wc_flags` bits.
    ibv_wc_read_wc_flags => read_wc_flags -> c_uint;
    /// The source LID (UD on InfiniBand).
    ibv_wc_read_slid => read_slid -> u32, "IBV_WC_EX_WITH_SLID";
    /// The service level.
    ibv_wc_read_sl => read_sl -> u8, "IBV_WC_EX_WITH_SL";
    /// The destination LID path bits.
    ibv_wc_read_dlid_path_bits => read_dlid_path_bits -> u8, "IBV_WC_EX_WITH_DLID_PATH_BITS";
    /// The completion's timestamp in device clock ticks.
    ibv_wc_read_completion_ts => read_completion_ts -> u64, "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP";
    /// The completion's timestamp in nanoseconds of wall-clock time.
    ibv_wc_read_completion_wallclock_ns => read_completion_wallclock_ns -> u64,
        "IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK";
    /// The customer VLAN of a received packet.
    ibv_wc_read_cvlan => read_cvlan -> u16, "IBV_WC_EX_WITH_CVLAN";
    /// The flow tag of a received packet.
    ibv_wc_read_flow_tag => read_flow_tag -> u32, "IBV_WC_EX_WITH_FLOW_TAG";
}

/// Reads the tag-matching information of the current completion into `tm_info`.
///
/// # Safety
///
/// As for the other `ibv_wc_read_*`; `tm_info` must be valid for writing.
///
/// # Panics
///
/// If the provider did not set `read_tm_info` (CQ created without
/// `IBV_WC_EX_WITH_TM_INFO`).
#[inline]
pub unsafe fn ibv_wc_read_tm_info(cq: *mut ibv_cq_ex, tm_info: *mut ibv_wc_tm_info) {
    // SAFETY: `cq` is live with a current completion and `tm_info` writable.
    unsafe {
        match (*cq).read_tm_info {
            Some(read) => read(cq, tm_info),
            None => missing_op("read_tm_info"),
        }
    }
}

// ---------------------------------------------------------------------------
// Shared receive queues
// ---------------------------------------------------------------------------

/// Creates an SRQ from extended attributes; null with `errno` set on failure.
/// A basic SRQ described only by PD (and type) goes through `ibv_create_srq`.
///
/// # Safety
///
/// `context` must be live and `srq_init_attr_ex` valid for reading and writing.
#[inline]
pub unsafe fn ibv_create_srq_ex(
    context: *mut ibv_context,
    srq_init_attr_ex: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    const PD: u32 = ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_PD.0;
    const TYPE: u32 = ibv_srq_init_attr_mask::IBV_SRQ_INIT_ATTR_TYPE.0;
    // SAFETY: the attributes are readable (caller's contract).
    let (mask, srq_type, pd) = unsafe {
        let attr = &*srq_init_attr_ex;
        (attr.comp_mask, attr.srq_type, attr.pd)
    };
    if mask & !(PD | TYPE) == 0 && mask & PD != 0 && (mask & TYPE == 0 || srq_type == ibv_srq_type::IBV_SRQT_BASIC) {
        // SAFETY: `ibv_srq_init_attr` is the prefix of the extended attributes, which is
        // how the C inline passes them too.
        return unsafe { ibv_create_srq(pd, srq_init_attr_ex.cast::<ibv_srq_init_attr>()) };
    }
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, create_srq_ex) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(context, srq_init_attr_ex) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Reads the SRQ number (of an XRC SRQ) into `srq_num`; returns 0 or an errno value.
///
/// # Safety
///
/// `srq` must be live and `srq_num` valid for writing.
#[inline]
pub unsafe fn ibv_get_srq_num(srq: *mut ibv_srq, srq_num: *mut u32) -> c_int {
    // SAFETY: `srq` is live, so its context is too.
    unsafe {
        match vctx_op!((*srq).context, get_srq_num) {
            Some(get) => get(srq, srq_num),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Posts a list of receive work requests to an SRQ. Returns 0 or an errno
/// value, with `*bad_recv_wr` set to the first request not posted.
///
/// # Safety
///
/// `srq` must be live, `recv_wr` a valid list whose buffers are registered and
/// stay valid until their completions, `bad_recv_wr` valid for writing.
#[inline]
pub unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` is live, so its context is; the slot is always filled by
    // libibverbs (see `ibv_poll_cq`), and the fallback is what its stub returns.
    unsafe {
        match (*(*srq).context).ops.post_srq_recv {
            Some(post) => post(srq, recv_wr, bad_recv_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Posts tag-matching operations to an SRQ. On `EOPNOTSUPP`, `*bad_op` is `op`.
///
/// # Safety
///
/// `srq` must be live, `op` a valid list, `bad_op` valid for writing.
#[inline]
pub unsafe fn ibv_post_srq_ops(srq: *mut ibv_srq, op: *mut ibv_ops_wr, bad_op: *mut *mut ibv_ops_wr) -> c_int {
    // SAFETY: `srq` is live, so its context is; `bad_op` is writable.
    unsafe {
        match vctx_op!((*srq).context, post_srq_ops) {
            Some(post) => post(srq, op, bad_op),
            None => {
                *bad_op = op;
                libc::EOPNOTSUPP
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Queue pairs
// ---------------------------------------------------------------------------

/// Creates a QP from extended attributes; null with `errno` set on failure.
/// When `comp_mask` is exactly `IBV_QP_INIT_ATTR_PD`, goes through `ibv_create_qp`.
///
/// # Safety
///
/// `context` must be live and `qp_init_attr_ex` valid for reading and writing.
#[inline]
pub unsafe fn ibv_create_qp_ex(context: *mut ibv_context, qp_init_attr_ex: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    // SAFETY: the attributes are readable (caller's contract).
    let (mask, pd) = unsafe { ((*qp_init_attr_ex).comp_mask, (*qp_init_attr_ex).pd) };
    if mask == ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 {
        // SAFETY: `ibv_qp_init_attr` is the prefix of the extended attributes, which is
        // how the C inline passes them too.
        return unsafe { ibv_create_qp(pd, qp_init_attr_ex.cast::<ibv_qp_init_attr>()) };
    }
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, create_qp_ex) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(context, qp_init_attr_ex) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Opens a shareable (XRC target) QP; null with `errno` set on failure.
///
/// # Safety
///
/// `context` must be live and `qp_open_attr` valid for reading.
#[inline]
pub unsafe fn ibv_open_qp(context: *mut ibv_context, qp_open_attr: *mut ibv_qp_open_attr) -> *mut ibv_qp {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, open_qp) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(open) => unsafe { open(context, qp_open_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Sets a QP's send rate limit; returns 0 or an errno value.
///
/// # Safety
///
/// `qp` must be live and `attr` valid for reading.
#[inline]
pub unsafe fn ibv_modify_qp_rate_limit(qp: *mut ibv_qp, attr: *mut ibv_qp_rate_limit_attr) -> c_int {
    // SAFETY: `qp` is live, so its context is too.
    unsafe {
        match vctx_op!((*qp).context, modify_qp_rate_limit) {
            Some(modify) => modify(qp, attr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Posts a list of send work requests. Returns 0 or an errno value, with
/// `*bad_wr` set to the first request not posted.
///
/// # Safety
///
/// `qp` must be live, `wr` a valid list whose (non-inline) buffers are registered
/// and stay valid until their completions, `bad_wr` valid for writing.
#[inline]
pub unsafe fn ibv_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: `qp` is live, so its context is; the slot is always filled by
    // libibverbs (see `ibv_poll_cq`), and the fallback is what its stub returns.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(post) => post(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Posts a list of receive work requests. Returns 0 or an errno value, with
/// `*bad_wr` set to the first request not posted.
///
/// # Safety
///
/// `qp` must be live, `wr` a valid list whose buffers are registered and stay
/// valid until their completions, `bad_wr` valid for writing.
#[inline]
pub unsafe fn ibv_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    // SAFETY: `qp` is live, so its context is; the slot is always filled by
    // libibverbs (see `ibv_poll_cq`), and the fallback is what its stub returns.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(post) => post(qp, wr, bad_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Whether the bit of QP type `qpt` is set in a per-QP-type capability mask
/// (such as `supported_qpts` of the TSO, RSS or packet pacing capabilities).
/// A type past bit 31 is reported unsupported (C would shift out of range).
#[inline]
pub const fn ibv_is_qpt_supported(caps: u32, qpt: ibv_qp_type) -> c_int {
    match 1u32.checked_shl(qpt.0) {
        Some(bit) => (caps & bit != 0) as c_int,
        None => 0,
    }
}

/// Derives a RoCE v2 UDP source port from a 20-bit flow label.
#[inline]
pub const fn ibv_flow_label_to_udp_sport(fl: u32) -> u16 {
    let fl_low = (fl & 0x03fff) ^ ((fl & 0xfc000) >> 14);
    (fl_low | 0xc000) as u16
}

// ---------------------------------------------------------------------------
// Extended QP: building work requests with ibv_wr_*
// ---------------------------------------------------------------------------

/// Generates the void `ibv_wr_*` functions: each calls one `wr_*` op of the
/// extended QP with its arguments.
macro_rules! wr_ops {
    ($( $(#[$doc:meta])* $name:ident => $op:ident ( $($arg:ident : $ty:ty),* ), $flag:literal; )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// `qp` must be a live extended QP (from `ibv_qp_to_qp_ex`) inside a batch this
        /// thread opened: after [`ibv_wr_start`], before [`ibv_wr_complete`] or
        /// [`ibv_wr_abort`]. Pointer arguments must be valid for the provider to read.
        ///
        /// # Panics
        ///
        #[doc = concat!(
            "If the provider did not set `", stringify!($op), "`, which it may leave \
             unset unless the QP was created with ", $flag, "."
        )]
        #[inline]
        pub unsafe fn $name(qp: *mut ibv_qp_ex $(, $arg: $ty)*) {
            // SAFETY: `qp` is a live extended QP in a started batch (caller's contract);
            // the op is the provider's, called with the caller's arguments as in C.
            unsafe {
                match (*qp).$op {
                    Some(op) => op(qp $(, $arg)*),
                    None => missing_op(stringify!($op)),
                }
            }
        }
    )*};
}

/// Opens a batch of work requests on `qp`; the provider holds the QP's send lock
/// until [`ibv_wr_complete`] or [`ibv_wr_abort`]. Set `wr_id` and `wr_flags` in
/// `*qp` before each work request builder.
///
/// # Safety
///
/// `qp` must be a live extended QP (from `ibv_qp_to_qp_ex`) with no batch open by
/// this thread.
///
/// # Panics
///
/// If the provider did not set `wr_start`, which it sets only on QPs created with
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
#[inline]
pub unsafe fn ibv_wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: `qp` is a live extended QP (caller's contract); the op is the provider's.
    unsafe {
        match (*qp).wr_start {
            Some(start) => start(qp),
            None => missing_op("wr_start"),
        }
    }
}

wr_ops! {
    /// Drops every work request built since [`ibv_wr_start`].
    ibv_wr_abort => wr_abort(), "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`";
    /// Adds an atomic compare-and-swap of the 8 bytes at `remote_addr`; the old value
    /// lands in the local buffer given next with [`ibv_wr_set_sge`].
    ibv_wr_atomic_cmp_swp => wr_atomic_cmp_swp(rkey: u32, remote_addr: u64, compare: u64, swap: u64),
        "`IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP` in `send_ops_flags`";
    /// Adds an atomic fetch-and-add on the 8 bytes at `remote_addr`; the old value
    /// lands in the local buffer given next with [`ibv_wr_set_sge`].
    ibv_wr_atomic_fetch_add => wr_atomic_fetch_add(rkey: u32, remote_addr: u64, add: u64),
        "`IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD` in `send_ops_flags`";
    /// Adds a bind of memory window `mw` (type 2) with the new `rkey`.
    ibv_wr_bind_mw => wr_bind_mw(mw: *mut ibv_mw, rkey: u32, bind_info: *const ibv_mw_bind_info),
        "`IBV_QP_EX_WITH_BIND_MW` in `send_ops_flags`";
    /// Adds a local invalidation of `invalidate_rkey`.
    ibv_wr_local_inv => wr_local_inv(invalidate_rkey: u32),
        "`IBV_QP_EX_WITH_LOCAL_INV` in `send_ops_flags`";
    /// Adds an RDMA read from `remote_addr` into the buffer given next.
    ibv_wr_rdma_read => wr_rdma_read(rkey: u32, remote_addr: u64),
        "`IBV_QP_EX_WITH_RDMA_READ` in `send_ops_flags`";
    /// Adds an RDMA write to `remote_addr` of the data given next.
    ibv_wr_rdma_write => wr_rdma_write(rkey: u32, remote_addr: u64),
        "`IBV_QP_EX_WITH_RDMA_WRITE` in `send_ops_flags`";
    /// Adds an RDMA write with immediate data (network byte order).
    ibv_wr_rdma_write_imm => wr_rdma_write_imm(rkey: u32, remote_addr: u64, imm_data: __be32),
        "`IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM` in `send_ops_flags`";
    /// Adds a send of the data given next.
    ibv_wr_send => wr_send(), "`IBV_QP_EX_WITH_SEND` in `send_ops_flags`";
    /// Adds a send with immediate data (network byte order).
    ibv_wr_send_imm => wr_send_imm(imm_data: __be32),
        "`IBV_QP_EX_WITH_SEND_WITH_IMM` in `send_ops_flags`";
    /// Adds a send that invalidates `invalidate_rkey` at the receiver.
    ibv_wr_send_inv => wr_send_inv(invalidate_rkey: u32),
        "`IBV_QP_EX_WITH_SEND_WITH_INV` in `send_ops_flags`";
    /// Adds a TCP segmentation offload send (raw packet QPs).
    ibv_wr_send_tso => wr_send_tso(hdr: *mut c_void, hdr_sz: u16, mss: u16),
        "`IBV_QP_EX_WITH_TSO` in `send_ops_flags`";
    /// Sets the destination of the current UD work request.
    ibv_wr_set_ud_addr => wr_set_ud_addr(ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32),
        "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` on a UD QP";
    /// Sets the remote SRQ number of the current XRC work request.
    ibv_wr_set_xrc_srqn => wr_set_xrc_srqn(remote_srqn: u32),
        "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` on an XRC QP";
    /// Copies `length` bytes at `addr` into the current work request (inline data).
    /// On rxe (seen with rdma-core 44 on Linux 6.1) the bytes are only sent when
    /// `wr_flags` also has `IBV_SEND_INLINE`; other providers ignore that flag here.
    ibv_wr_set_inline_data => wr_set_inline_data(addr: *mut c_void, length: usize),
        "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`";
    /// Copies `num_buf` buffers into the current work request (inline data).
    ibv_wr_set_inline_data_list => wr_set_inline_data_list(num_buf: usize, buf_list: *const ibv_data_buf),
        "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`";
    /// Sets the one local buffer of the current work request.
    ibv_wr_set_sge => wr_set_sge(lkey: u32, addr: u64, length: u32),
        "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`";
    /// Sets `num_sge` local buffers of the current work request.
    ibv_wr_set_sge_list => wr_set_sge_list(num_sge: usize, sg_list: *const ibv_sge),
        "`IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`";
    /// Adds an 8-byte atomic write of `*atomic_wr` to `remote_addr`.
    ibv_wr_atomic_write => wr_atomic_write(rkey: u32, remote_addr: u64, atomic_wr: *const c_void),
        "`IBV_QP_EX_WITH_ATOMIC_WRITE` in `send_ops_flags`";
}

/// Posts every work request built since [`ibv_wr_start`] and closes the batch.
/// Returns 0 or an errno value (then nothing of the batch was posted).
///
/// # Safety
///
/// `qp` must be a live extended QP with a batch opened by [`ibv_wr_start`]; the
/// buffers of the batch must stay valid until their completions.
#[inline]
pub unsafe fn ibv_wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    // SAFETY: `qp` is live with an open batch; the op is the provider's, set with
    // `wr_start` whenever send ops were requested.
    unsafe {
        match (*qp).wr_complete {
            Some(complete) => complete(qp),
            None => libc::EOPNOTSUPP,
        }
    }
}

// ---------------------------------------------------------------------------
// Work queues and RSS indirection tables
// ---------------------------------------------------------------------------

/// Creates a work queue; null with `errno` set on failure. On success the WQ's
/// user context, event count, mutex and condition variable are initialised, as
/// the C inline does.
///
/// # Safety
///
/// `context` must be live and `wq_init_attr` valid for reading and writing.
#[inline]
pub unsafe fn ibv_create_wq(context: *mut ibv_context, wq_init_attr: *mut ibv_wq_init_attr) -> *mut ibv_wq {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    let wq = match unsafe { vctx_op!(context, create_wq) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(context, wq_init_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            return null_mut();
        }
    };
    if !wq.is_null() {
        // SAFETY: the provider just returned this WQ, not yet shared; `wq_init_attr` is
        // readable. The bindings' pthread types are glibc's, so libc's functions apply.
        unsafe {
            (*wq).wq_context = (*wq_init_attr).wq_context;
            (*wq).events_completed = 0;
            libc::pthread_mutex_init(ptr::addr_of_mut!((*wq).mutex).cast(), ptr::null());
            libc::pthread_cond_init(ptr::addr_of_mut!((*wq).cond).cast(), ptr::null());
        }
    }
    wq
}

/// Changes a work queue's state or attributes; returns 0 or an errno value.
///
/// # Safety
///
/// `wq` must be live and `wq_attr` valid for reading and writing.
#[inline]
pub unsafe fn ibv_modify_wq(wq: *mut ibv_wq, wq_attr: *mut ibv_wq_attr) -> c_int {
    // SAFETY: `wq` is live, so its context is too.
    unsafe {
        match vctx_op!((*wq).context, modify_wq) {
            Some(modify) => modify(wq, wq_attr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Destroys a work queue; returns 0 or an errno value.
///
/// # Safety
///
/// `wq` must be live and not used afterwards.
#[inline]
pub unsafe fn ibv_destroy_wq(wq: *mut ibv_wq) -> c_int {
    // SAFETY: `wq` is live, so its context is too.
    unsafe {
        match vctx_op!((*wq).context, destroy_wq) {
            Some(destroy) => destroy(wq),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Posts a list of receive work requests to a work queue. Returns 0 or an errno
/// value, with `*bad_recv_wr` set to the first request not posted.
///
/// # Safety
///
/// As for [`ibv_post_recv`], with a live `wq`.
#[inline]
pub unsafe fn ibv_post_wq_recv(
    wq: *mut ibv_wq,
    recv_wr: *mut ibv_recv_wr,
    bad_recv_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: `wq` is live; its `post_recv` is the provider's, set when it was created.
    unsafe {
        match (*wq).post_recv {
            Some(post) => post(wq, recv_wr, bad_recv_wr),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Creates a receive work queue indirection table (RSS); null with `errno` set
/// on failure.
///
/// # Safety
///
/// `context` must be live and `init_attr` valid for reading.
#[inline]
pub unsafe fn ibv_create_rwq_ind_table(
    context: *mut ibv_context,
    init_attr: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, create_rwq_ind_table) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(context, init_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Destroys an indirection table; returns 0 or an errno value.
///
/// # Safety
///
/// `rwq_ind_table` must be live and not used afterwards.
#[inline]
pub unsafe fn ibv_destroy_rwq_ind_table(rwq_ind_table: *mut ibv_rwq_ind_table) -> c_int {
    // SAFETY: the table is live, so its context is too.
    unsafe {
        match vctx_op!((*rwq_ind_table).context, destroy_rwq_ind_table) {
            Some(destroy) => destroy(rwq_ind_table),
            None => libc::EOPNOTSUPP,
        }
    }
}

// ---------------------------------------------------------------------------
// XRC domains
// ---------------------------------------------------------------------------

/// Opens an XRC domain; null with `errno` set on failure.
///
/// # Safety
///
/// `context` must be live and `xrcd_init_attr` valid for reading.
#[inline]
pub unsafe fn ibv_open_xrcd(context: *mut ibv_context, xrcd_init_attr: *mut ibv_xrcd_init_attr) -> *mut ibv_xrcd {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, open_xrcd) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(open) => unsafe { open(context, xrcd_init_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Closes an XRC domain; returns 0 or an errno value.
///
/// The C inline calls the op without any check, since an XRCD only exists on a
/// context that had `open_xrcd` (and `close_xrcd` sits after it, so a context
/// large enough for one has the other). This port checks as the other ports do, and
/// returns `EOPNOTSUPP` where C would call a null pointer.
///
/// # Safety
///
/// `xrcd` must be live and not used afterwards.
#[inline]
pub unsafe fn ibv_close_xrcd(xrcd: *mut ibv_xrcd) -> c_int {
    // SAFETY: `xrcd` is live, so its context is too.
    unsafe {
        match vctx_op!((*xrcd).context, close_xrcd) {
            Some(close) => close(xrcd),
            None => libc::EOPNOTSUPP,
        }
    }
}

// ---------------------------------------------------------------------------
// Flow steering
// ---------------------------------------------------------------------------

/// Attaches a flow steering rule to `qp`; null with `errno` set on failure.
///
/// # Safety
///
/// `qp` must be live and `flow` a valid rule (header plus its specs).
#[inline]
pub unsafe fn ibv_create_flow(qp: *mut ibv_qp, flow: *mut ibv_flow_attr) -> *mut ibv_flow {
    // SAFETY: `qp` is live, so its context is too.
    match unsafe { vctx_op!((*qp).context, ibv_create_flow) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(qp, flow) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Removes a flow steering rule; returns 0 or an errno value.
///
/// # Safety
///
/// `flow_id` must be live and not used afterwards.
#[inline]
pub unsafe fn ibv_destroy_flow(flow_id: *mut ibv_flow) -> c_int {
    // SAFETY: the flow is live, so its context is too.
    unsafe {
        match vctx_op!((*flow_id).context, ibv_destroy_flow) {
            Some(destroy) => destroy(flow_id),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Creates an ESP (IPsec) flow action; null with `errno` set on failure.
///
/// # Safety
///
/// `ctx` must be live and `esp` valid for reading.
#[inline]
pub unsafe fn ibv_create_flow_action_esp(
    ctx: *mut ibv_context,
    esp: *mut ibv_flow_action_esp_attr,
) -> *mut ibv_flow_action {
    // SAFETY: `ctx` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(ctx, create_flow_action_esp) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(ctx, esp) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Changes an ESP flow action; returns 0 or an errno value.
///
/// # Safety
///
/// `action` must be live and `esp` valid for reading.
#[inline]
pub unsafe fn ibv_modify_flow_action_esp(action: *mut ibv_flow_action, esp: *mut ibv_flow_action_esp_attr) -> c_int {
    // SAFETY: the action is live, so its context is too.
    unsafe {
        match vctx_op!((*action).context, modify_flow_action_esp) {
            Some(modify) => modify(action, esp),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Destroys a flow action; returns 0 or an errno value.
///
/// # Safety
///
/// `action` must be live and not used afterwards.
#[inline]
pub unsafe fn ibv_destroy_flow_action(action: *mut ibv_flow_action) -> c_int {
    // SAFETY: the action is live, so its context is too.
    unsafe {
        match vctx_op!((*action).context, destroy_flow_action) {
            Some(destroy) => destroy(action),
            None => libc::EOPNOTSUPP,
        }
    }
}

// ---------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------

/// Creates a counters object; null with `errno` set on failure.
///
/// # Safety
///
/// `context` must be live and `init_attr` valid for reading.
#[inline]
pub unsafe fn ibv_create_counters(
    context: *mut ibv_context,
    init_attr: *mut ibv_counters_init_attr,
) -> *mut ibv_counters {
    // SAFETY: `context` is live; the op was found in its verbs_context.
    match unsafe { vctx_op!(context, create_counters) } {
        // SAFETY: the provider's op with the caller's arguments, as in C.
        Some(create) => unsafe { create(context, init_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            null_mut()
        }
    }
}

/// Destroys a counters object; returns 0 or an errno value.
///
/// # Safety
///
/// `counters` must be live and not used afterwards.
#[inline]
pub unsafe fn ibv_destroy_counters(counters: *mut ibv_counters) -> c_int {
    // SAFETY: `counters` is live, so its context is too.
    unsafe {
        match vctx_op!((*counters).context, destroy_counters) {
            Some(destroy) => destroy(counters),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Attaches a counter to a flow; returns 0 or an errno value.
///
/// # Safety
///
/// `counters` must be live, `attr` valid for reading, `flow` live or null as the
/// provider allows.
#[inline]
pub unsafe fn ibv_attach_counters_point_flow(
    counters: *mut ibv_counters,
    attr: *mut ibv_counter_attach_attr,
    flow: *mut ibv_flow,
) -> c_int {
    // SAFETY: `counters` is live, so its context is too.
    unsafe {
        match vctx_op!((*counters).context, attach_counters_point_flow) {
            Some(attach) => attach(counters, attr, flow),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// Reads up to `ncounters` counter values; returns 0 or an errno value.
///
/// # Safety
///
/// `counters` must be live and `counters_value` valid for writing `ncounters` values.
#[inline]
pub unsafe fn ibv_read_counters(
    counters: *mut ibv_counters,
    counters_value: *mut u64,
    ncounters: u32,
    flags: u32,
) -> c_int {
    // SAFETY: `counters` is live, so its context is too.
    unsafe {
        match vctx_op!((*counters).context, read_counters) {
            Some(read) => read(counters, counters_value, ncounters, flags),
            None => libc::EOPNOTSUPP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_wraps_the_low_byte_only() {
        assert_eq!(ibv_inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(ibv_inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(ibv_inc_rkey(u32::MAX), 0xffff_ff00);
    }

    #[test]
    fn flow_label_to_udp_sport_matches_the_c_formula() {
        // fl_low ^= fl_high >> 14, then OR 0xC000.
        assert_eq!(ibv_flow_label_to_udp_sport(0), 0xc000);
        assert_eq!(ibv_flow_label_to_udp_sport(0x3fff), 0xffff);
        assert_eq!(ibv_flow_label_to_udp_sport(0x4000), 0xc001);
        assert_eq!(ibv_flow_label_to_udp_sport(0xfffff), 0xc000 | (0x3fff ^ 0x3f));
    }

    #[test]
    fn qpt_supported_tests_the_type_bit() {
        let caps = 1 << ibv_qp_type::IBV_QPT_RC.0;
        assert_eq!(ibv_is_qpt_supported(caps, ibv_qp_type::IBV_QPT_RC), 1);
        assert_eq!(ibv_is_qpt_supported(caps, ibv_qp_type::IBV_QPT_UD), 0);
    }

    #[test]
    fn verbs_get_ctx_op_honours_sz_and_null_ops() {
        unsafe extern "C" fn fake_modify_cq(_: *mut ibv_cq, _: *mut ibv_modify_cq_attr) -> c_int {
            7
        }
        let mut vctx = verbs_context::default();
        vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
        vctx.sz = size_of::<verbs_context>();
        let vctx_ptr = ptr::addr_of_mut!(vctx);
        // SAFETY: `ctx` is the context inside `vctx`, derived from a pointer to the whole
        // struct as a C allocation would be, and live for the whole test.
        unsafe {
            let ctx = ptr::addr_of_mut!((*vctx_ptr).context);
            assert_eq!(verbs_get_ctx(ctx), vctx_ptr);
            // Unset op: null.
            assert!(verbs_get_ctx_op(ctx, offset_of!(verbs_context, modify_cq)).is_null());
            (*vctx_ptr).modify_cq = Some(fake_modify_cq);
            assert_eq!(verbs_get_ctx_op(ctx, offset_of!(verbs_context, modify_cq)), vctx_ptr);
            // A provider context too small to hold the field: null.
            (*vctx_ptr).sz = size_of::<verbs_context>() - offset_of!(verbs_context, modify_cq) - 1;
            assert!(verbs_get_ctx_op(ctx, offset_of!(verbs_context, modify_cq)).is_null());
            (*vctx_ptr).sz = size_of::<verbs_context>() - offset_of!(verbs_context, modify_cq);
            // The port reaches the op through the CQ's context and returns its value.
            let mut cq = ibv_cq { context: ctx, ..Default::default() };
            assert_eq!(ibv_modify_cq(&mut cq, ptr::null_mut()), 7);
            // A context that is not extended has no verbs_context at all.
            (*vctx_ptr).context.abi_compat = ptr::null_mut();
            assert!(verbs_get_ctx(ctx).is_null());
            assert_eq!(ibv_modify_cq(&mut cq, ptr::null_mut()), libc::EOPNOTSUPP);
        }
    }

    #[test]
    fn null_context_ops_report_errors_instead_of_calling_address_zero() {
        // A context libibverbs did not make: every op slot is empty.
        let mut ctx_storage = ibv_context::default();
        let ctx: *mut ibv_context = &mut ctx_storage;
        let mut cq = ibv_cq { context: ctx, ..Default::default() };
        let mut qp = ibv_qp { context: ctx, ..Default::default() };
        let mut wc = ibv_wc::default();
        // SAFETY: the fakes are live; no op is called, since all are empty.
        unsafe {
            assert_eq!(ibv_poll_cq(&mut cq, 1, &mut wc), -libc::EOPNOTSUPP);
            assert_eq!(ibv_req_notify_cq(&mut cq, 0), libc::EOPNOTSUPP);
            let (mut bad_send, mut bad_recv) = (ptr::null_mut(), ptr::null_mut());
            assert_eq!(ibv_post_send(&mut qp, ptr::null_mut(), &mut bad_send), libc::EOPNOTSUPP);
            assert_eq!(ibv_post_recv(&mut qp, ptr::null_mut(), &mut bad_recv), libc::EOPNOTSUPP);
            let mut pd = ibv_pd { context: ctx, handle: 0 };
            *libc::__errno_location() = 0;
            assert!(ibv_alloc_mw(&mut pd, ibv_mw_type::IBV_MW_TYPE_1).is_null());
            assert_eq!(*libc::__errno_location(), libc::EOPNOTSUPP);
        }
    }

    #[test]
    fn bind_mw_checks_its_arguments_before_the_provider() {
        let mut ctx = ibv_context::default();
        let (mut pd_storage, mut other_pd) = (ibv_pd::default(), ibv_pd::default());
        let pd: *mut ibv_pd = &mut pd_storage;
        let mut mr_storage = ibv_mr { pd: &mut other_pd, ..Default::default() };
        let mr: *mut ibv_mr = &mut mr_storage;
        let mut mw = ibv_mw { context: &mut ctx, pd, type_: ibv_mw_type::IBV_MW_TYPE_2, ..Default::default() };
        let mut bind = ibv_mw_bind::default();
        let qp = ptr::null_mut();
        // SAFETY: the fakes are live and every case returns before the (empty) op slot.
        unsafe {
            assert_eq!(ibv_bind_mw(qp, &mut mw, &mut bind), libc::EINVAL, "type 2 window");
            mw.type_ = ibv_mw_type::IBV_MW_TYPE_1;
            bind.bind_info.length = 8;
            assert_eq!(ibv_bind_mw(qp, &mut mw, &mut bind), libc::EINVAL, "range without an MR");
            bind.bind_info.mr = mr;
            assert_eq!(ibv_bind_mw(qp, &mut mw, &mut bind), libc::EPERM, "MR of another PD");
            (*mr).pd = pd;
            assert_eq!(ibv_bind_mw(qp, &mut mw, &mut bind), libc::EOPNOTSUPP, "empty bind_mw slot");
        }
    }

    #[test]
    fn extended_cq_and_qp_ops_that_were_not_requested_are_reported() {
        let mut cq = ibv_cq_ex::default();
        let mut qp = ibv_qp_ex::default();
        // SAFETY: the fakes are live; every op slot is empty, so nothing is called.
        unsafe {
            assert_eq!(ibv_start_poll(&mut cq, ptr::null_mut()), libc::EOPNOTSUPP);
            assert_eq!(ibv_wr_complete(&mut qp), libc::EOPNOTSUPP);
        }
        let cq_ptr = ptr::addr_of_mut!(cq) as usize;
        // SAFETY: as above; the panic happens before any call.
        let panic = std::panic::catch_unwind(|| unsafe { ibv_wc_read_completion_ts(cq_ptr as *mut ibv_cq_ex) })
            .expect_err("reading an unrequested field must panic");
        let msg = panic.downcast_ref::<String>().expect("a formatted panic message");
        assert!(msg.contains("read_completion_ts"), "{msg}");
        let qp_ptr = ptr::addr_of_mut!(qp) as usize;
        // SAFETY: as above.
        let panic = std::panic::catch_unwind(|| unsafe { ibv_wr_rdma_write(qp_ptr as *mut ibv_qp_ex, 1, 2) })
            .expect_err("an unrequested work request op must panic");
        let msg = panic.downcast_ref::<String>().expect("a formatted panic message");
        assert!(msg.contains("wr_rdma_write"), "{msg}");
    }
}
