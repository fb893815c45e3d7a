//! Enhanced connection establishment (ECE): vendor options two QPs agree on while they
//! connect (`ibv_set_ece`, `ibv_query_ece`).

use crate::error::{Error, Result, Verb};
use crate::ffi;

use super::QueuePair;

/// The ECE options of a QP (`struct ibv_ece`): which vendor's options, and the option
/// bits, whose meaning is that vendor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ece {
    /// The IEEE OUI of the vendor whose options these are (Mellanox: 0x2c9).
    pub vendor_id: u32,
    /// The option bits.
    pub options: u32,
}

fn check_ece(ece: &Ece) -> Result<()> {
    if ece.vendor_id == 0 || ece.vendor_id > 0x00ff_ffff {
        return Err(Error::invalid(
            Verb::QpSetEce,
            format!("vendor id {:#x} is not an IEEE OUI (24 bits, not 0)", ece.vendor_id),
        ));
    }
    Ok(())
}

/// The errno of an ECE verb as an error: `EOPNOTSUPP` is the provider saying it has no ECE.
fn ece_error(verb: Verb, rc: i32) -> Error {
    Error::verb_or_not_supported(verb, rc.abs(), "ECE: the provider has no set_ece/query_ece")
}

impl QueuePair {
    /// Sets the ECE options this side offers (`ibv_set_ece`), before the QP goes to RTR
    /// (the active side) or with the peer's options (the passive side), as ibv_set_ece(3)
    /// describes. A vendor id that is 0 or wider than 24 bits is
    /// [`Error::InvalidArgument`] naming [`Verb::QpSetEce`] before C (the bits mean nothing
    /// without a vendor; C would say `EOPNOTSUPP`, which reads as "no ECE"). A
    /// provider without ECE (rxe) gives [`Error::NotSupported`] naming [`Verb::SetEce`] and
    /// `EOPNOTSUPP`.
    #[doc(alias = "ibv_set_ece")]
    pub fn set_ece(&self, ece: Ece) -> Result<()> {
        check_ece(&ece)?;
        let mut raw = ffi::ibv_ece { vendor_id: ece.vendor_id, options: ece.options, comp_mask: 0 };
        // SAFETY: the QP is live and `raw` is readable.
        match unsafe { ffi::ibv_set_ece(self.as_raw(), &mut raw) } {
            0 => Ok(()),
            rc => Err(ece_error(Verb::SetEce, rc)),
        }
    }

    /// The ECE options in force on the QP (`ibv_query_ece`): after the connection is made,
    /// what both sides agreed on. A provider without ECE (rxe) gives
    /// [`Error::NotSupported`] naming [`Verb::QueryEce`] and `EOPNOTSUPP`.
    #[doc(alias = "ibv_query_ece")]
    pub fn query_ece(&self) -> Result<Ece> {
        let mut raw = ffi::ibv_ece { vendor_id: 0, options: 0, comp_mask: 0 };
        // SAFETY: the QP is live and `raw` is writable.
        match unsafe { ffi::ibv_query_ece(self.as_raw(), &mut raw) } {
            0 => Ok(Ece { vendor_id: raw.vendor_id, options: raw.options }),
            rc => Err(ece_error(Verb::QueryEce, rc)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_need_a_vendor_and_eopnotsupp_is_not_supported() {
        assert!(check_ece(&Ece { vendor_id: 0x2c9, options: 1 }).is_ok());
        let e = check_ece(&Ece { vendor_id: 0, options: 1 }).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { verb: Verb::QpSetEce, .. }), "{e}");
        assert!(check_ece(&Ece { vendor_id: 0x100_0000, options: 0 }).is_err());
        let e = ece_error(Verb::QueryEce, -libc::EOPNOTSUPP);
        assert!(matches!(&e, Error::NotSupported { verb: Verb::QueryEce, errno: Some(libc::EOPNOTSUPP), .. }), "{e}");
    }
}
