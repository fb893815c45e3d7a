//! The extended device attributes (`ibv_query_device_ex`) that the checks before C read:
//! ODP, XRC, device memory, CQ moderation.

use std::ptr;

use crate::context::Context;
use crate::conv;
use crate::error::{Result, Verb};
use crate::ffi;

/// The device's extended attributes; the fields a provider does not fill stay zero (a
/// capability reported absent).
pub(crate) fn device_attr_ex(ctx: &Context) -> Result<ffi::ibv_device_attr_ex> {
    // SAFETY: a plain C struct of integers, for which all zeros is valid.
    let mut attr: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: the context is open, no input, and `attr` is writable.
    let rc = unsafe { ffi::ibv_query_device_ex(ctx.as_raw(), ptr::null(), &mut attr) };
    conv::errno(Verb::QueryDeviceEx, rc)?;
    Ok(attr)
}
