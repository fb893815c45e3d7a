//! `Debug` for plain structs whose keys, QP numbers, PSNs and addresses print in hex, as
//! `ibv_devinfo`, `rdma` and the kernel's logs show them, beside decimal counts and sizes.

/// `debug_hex!(RemoteMr { addr: hex, len, rkey: hex })`: a `Debug` impl listing every
/// field in order, those marked `hex` as `0x...`.
macro_rules! debug_hex {
    ($name:ident { $($field:ident $(: $hex:ident)?),* $(,)? }) => {
        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    $(.field(stringify!($field), &$crate::debug_hex::debug_hex!(@value self.$field $(, $hex)?)))*
                    .finish()
            }
        }
    };
    (@value $v:expr) => { $v };
    (@value $v:expr, hex) => { format_args!("{:#x}", $v) };
}
pub(crate) use debug_hex;

#[cfg(test)]
mod tests {
    use crate::{ConnInfo, InitAttr, RemoteMr, RemoteQpInfo, RtsAttr};

    #[test]
    fn keys_qp_numbers_and_psns_print_in_hex_and_counts_in_decimal() {
        let mr = RemoteMr { addr: 0x7f00_1000, len: 4096, rkey: 0x800_0123 };
        assert_eq!(format!("{mr:?}"), "RemoteMr { addr: 0x7f001000, len: 4096, rkey: 0x8000123 }");
        let info = RemoteQpInfo { qpn: 0x11, psn: 0xabcdef, lid: 0, gid: Default::default() };
        let text = format!("{info:?}");
        assert!(text.starts_with("RemoteQpInfo { qpn: 0x11, psn: 0xabcdef, lid: 0x0, gid: "), "{text}");
        let rts = RtsAttr { sq_psn: 0x42, ..RtsAttr::default() };
        assert!(format!("{rts:?}").starts_with("RtsAttr { sq_psn: 0x42, timeout: 14, "), "{rts:?}");
        let init = InitAttr::default();
        assert!(format!("{init:?}").ends_with("qkey: 0x11111111 }"), "{init:?}");
        let conn = ConnInfo { qp_num: 0x1a, responder_resources: 16, ..ConnInfo::default() };
        let text = format!("{conn:?}");
        assert!(text.contains("responder_resources: 16") && text.ends_with("qp_num: 0x1a }"), "{text}");
    }
}
