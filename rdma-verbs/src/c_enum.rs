//! `c_enum!`: a Rust enum for a C enum that the provider or the kernel writes back, with
//! an `Unknown(raw)` arm so that a value from a newer rdma-core is data, not undefined
//! behaviour. The bottom of the crate: it names nothing else.

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident : $raw:ty { $($(#[$vm:meta])* $variant:ident = $value:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vm])* $variant,)*
            /// A value this crate does not know: data, not an error.
            Unknown($raw),
        }
        impl $name {
            /// Decodes the C value.
            #[inline]
            pub fn from_raw(v: $raw) -> Self {
                match v {
                    $(x if x == $value => $name::$variant,)*
                    other => $name::Unknown(other),
                }
            }
            /// The C value.
            #[inline]
            pub fn to_raw(self) -> $raw {
                match self {
                    $($name::$variant => $value,)*
                    $name::Unknown(v) => v,
                }
            }
        }
    };
}
pub(crate) use c_enum;
