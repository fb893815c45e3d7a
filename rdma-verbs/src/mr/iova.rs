//! Regions at a chosen I/O virtual address (`ibv_reg_mr_iova`): the device knows the
//! memory by an address the program picks, not by where it is in this process.

use super::*;

/// The checks of [`ProtectionDomain::register_at_iova`] on `iova` for `len` bytes at `addr`.
pub(super) fn check_iova(iova: u64, len: usize, addr: u64) -> Result<()> {
    if iova.checked_add(len as u64).is_none() {
        return Err(Error::invalid(
            Verb::PdRegisterAtIova,
            format!("I/O virtual address {iova:#x} plus {len} bytes overflows 64 bits"),
        ));
    }
    let page = page_size() as u64 - 1;
    if iova & page != addr & page {
        return Err(Error::invalid(
            Verb::PdRegisterAtIova,
            format!(
                "I/O virtual address {iova:#x} is at offset {:#x} in its page but the buffer at {addr:#x} is at \
                 offset {:#x}: the kernel maps whole pages, so the offsets must match",
                iova & page,
                addr & page
            ),
        ));
    }
    Ok(())
}

impl ProtectionDomain {
    /// Registers `buf` so that the device knows its first byte by `iova`
    /// (`ibv_reg_mr_iova`): the region's scatter/gather entries
    /// ([`sge`](MemoryRegion::sge)) and the [`remote`](MemoryRegion::remote) descriptor a
    /// peer targets use addresses from `iova` on ([`MemoryRegion::addr`]), whatever the
    /// buffer's place in this process. Such a region is a target of peers' RDMA (and a
    /// source for [`QueuePair::post_send_raw`](crate::QueuePair::post_send_raw)); it is
    /// not cut into [`Chunk`](crate::Chunk)s, whose device address is their address here.
    /// Mode `A` is chosen as for [`MemoryRegion::new`], and the access flags are checked
    /// as [`register`](Self::register) checks them.
    ///
    /// Refused before C ([`Error::InvalidArgument`] naming [`Verb::PdRegisterAtIova`]):
    /// an `iova` whose end overflows 64 bits, or whose offset in its page differs from
    /// the buffer's (the kernel maps whole pages, and says `EINVAL`). On error the buffer
    /// is dropped.
    #[doc(alias = "ibv_reg_mr_iova")]
    pub fn register_at_iova<B: RegisterableBuffer, A: AccessMode>(
        &self,
        buf: B,
        access: AccessFlags,
        iova: u64,
    ) -> Result<MemoryRegion<B, A>> {
        MemoryRegion::new_at(self, buf, access, Some(iova))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_iova_must_share_the_buffers_page_offset_and_not_overflow() {
        let page = page_size() as u64;
        assert!(check_iova(0x1_0000_0000, 4096, 0x7f00_0000_0000).is_ok());
        assert!(check_iova(5 * page + 16, 64, 9 * page + 16).is_ok());
        let e = check_iova(5 * page + 8, 64, 9 * page + 16).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::PdRegisterAtIova, .. }), "{e}");
        assert!(e.to_string().contains("offset"), "{e}");
        let e = check_iova(u64::MAX - page + 1, page as usize, 0).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
        assert!(check_iova(u64::MAX - page + 1, page as usize - 1, 0).is_ok());
    }
}
