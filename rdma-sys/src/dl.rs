//! The two libraries behind these bindings, and, with the feature `dlopen`, loading them
//! at run time.
//!
//! Without `dlopen` (the default) the program links libibverbs and librdmacm: the dynamic
//! loader maps them before `main`, and a node without them cannot start the program at
//! all. [`load`] then always succeeds.
//!
//! With `dlopen` nothing is linked. Each library is opened (`libibverbs.so.1`,
//! `librdmacm.so.1`) the first time [`load`] asks for it, and every C function these
//! bindings declare is resolved then, so a library that lacks one is refused whole, with
//! the function named, rather than failing at some later call. The functions of this
//! crate keep their names and signatures: each is a wrapper that calls through the
//! library's table, loading the library first if nothing did yet; one that cannot be
//! loaded makes the wrapper panic with the load error. The safe crate calls [`load`] at
//! each entry point (listing devices, opening one, making an rdma_cm event channel) and
//! returns its error, so safe code never gets there. The `static
//! inline` verbs ([`crate::inline`]) call the provider through the context's ops either
//! way: the data path does not change.

use std::ffi::c_void;
use std::fmt;

/// One of the user-space libraries of rdma-core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// libibverbs: devices, contexts, every verbs object. `ibv_*` functions.
    Ibverbs,
    /// librdmacm: the connection manager. `rdma_*` functions.
    Rdmacm,
}

impl Library {
    /// The file name the dynamic loader looks for (`libibverbs.so.1`).
    pub const fn soname(self) -> &'static str {
        match self {
            Library::Ibverbs => "libibverbs.so.1",
            Library::Rdmacm => "librdmacm.so.1",
        }
    }

    /// The packages that install it, on the two families of distributions.
    pub const fn packages(self) -> &'static str {
        match self {
            Library::Ibverbs => {
                "libibverbs1 and ibverbs-providers (Debian, Ubuntu) or libibverbs (Fedora, RHEL), from rdma-core"
            }
            Library::Rdmacm => "librdmacm1 (Debian, Ubuntu) or librdmacm (Fedora, RHEL), from rdma-core",
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.soname())
    }
}

/// Why a library is not usable: the user-space library layer of the RDMA stack is broken
/// or absent. Only the feature `dlopen` makes these; a linked program never starts instead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// The dynamic loader could not load it: not installed, unreadable, not a library, or
    /// a library it needs is missing. `why` is the loader's own message.
    NotLoaded {
        /// The library.
        library: Library,
        /// The loader's message (`dlerror`).
        why: String,
    },
    /// It loaded, but a function these bindings were made with is not in it: an rdma-core
    /// older than the headers this crate was built from.
    MissingSymbol {
        /// The library.
        library: Library,
        /// The first function it lacks.
        symbol: &'static str,
    },
}

impl LoadError {
    /// The library that could not be used.
    pub fn library(&self) -> Library {
        match self {
            LoadError::NotLoaded { library, .. } | LoadError::MissingSymbol { library, .. } => *library,
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotLoaded { library, why } => write!(
                f,
                "the user-space library {library} could not be loaded: {why} (it comes with {})",
                library.packages()
            ),
            LoadError::MissingSymbol { library, symbol } => write!(
                f,
                "the user-space library {library} lacks {symbol}: it is older than the rdma-core this program \
                 was built for (update {})",
                library.packages()
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// True when this build loads the libraries at run time (feature `dlopen`).
pub const DYNAMIC: bool = cfg!(feature = "dlopen");

/// Makes `library` usable: with `dlopen`, loads it and resolves every function the first
/// time (later calls return the first outcome); linked, it is there already.
pub fn load(library: Library) -> Result<(), LoadError> {
    imp::load(library)
}

/// An address inside the loaded library (one of its functions), for `dladdr` to name its
/// file; `None` when it is not loaded.
pub fn address(library: Library) -> Option<*const c_void> {
    imp::address(library)
}

#[cfg(not(feature = "dlopen"))]
mod imp {
    use super::{c_void, Library, LoadError};

    pub(super) fn load(_: Library) -> Result<(), LoadError> {
        Ok(())
    }

    pub(super) fn address(library: Library) -> Option<*const c_void> {
        Some(match library {
            Library::Ibverbs => crate::ibv_get_device_list as *const c_void,
            Library::Rdmacm => crate::rdma_create_event_channel as *const c_void,
        })
    }
}

#[cfg(feature = "dlopen")]
mod imp {
    use std::sync::OnceLock;

    use super::{c_void, Library, LoadError};
    use crate::{LibibverbsFns, LibrdmacmFns};

    /// An open library and its resolved table; the library stays open for the life of
    /// the process (it is never dropped from its static), so the table stays valid.
    struct Loaded<T> {
        _library: libloading::Library,
        fns: T,
    }

    static IBVERBS: OnceLock<Result<Loaded<LibibverbsFns>, LoadError>> = OnceLock::new();
    static RDMACM: OnceLock<Result<Loaded<LibrdmacmFns>, LoadError>> = OnceLock::new();

    fn open<T>(
        library: Library,
        resolve: fn(&libloading::Library) -> Result<T, &'static str>,
    ) -> Result<Loaded<T>, LoadError> {
        let flags = libc::RTLD_NOW | libc::RTLD_LOCAL;
        // SAFETY: loading runs the library's initialisers. These are rdma-core's libraries,
        // found by their soname as the dynamic loader would for a linked program; their
        // initialisers set up only their own state, as when linked.
        let opened = unsafe { libloading::os::unix::Library::open(Some(library.soname()), flags) };
        let lib: libloading::Library = opened.map_err(|e| LoadError::NotLoaded { library, why: e.to_string() })?.into();
        let fns = resolve(&lib).map_err(|symbol| LoadError::MissingSymbol { library, symbol })?;
        Ok(Loaded { _library: lib, fns })
    }

    fn ibverbs() -> &'static Result<Loaded<LibibverbsFns>, LoadError> {
        IBVERBS.get_or_init(|| open(Library::Ibverbs, LibibverbsFns::resolve))
    }

    fn rdmacm() -> &'static Result<Loaded<LibrdmacmFns>, LoadError> {
        RDMACM.get_or_init(|| open(Library::Rdmacm, LibrdmacmFns::resolve))
    }

    pub(super) fn load(library: Library) -> Result<(), LoadError> {
        let outcome = match library {
            Library::Ibverbs => ibverbs().as_ref().map(|_| ()),
            Library::Rdmacm => rdmacm().as_ref().map(|_| ()),
        };
        outcome.map_err(Clone::clone)
    }

    pub(super) fn address(library: Library) -> Option<*const c_void> {
        match library {
            Library::Ibverbs => ibverbs().as_ref().ok().map(|l| l.fns.ibv_get_device_list as *const c_void),
            Library::Rdmacm => rdmacm().as_ref().ok().map(|l| l.fns.rdma_create_event_channel as *const c_void),
        }
    }

    #[cold]
    #[inline(never)]
    fn unusable(e: &LoadError) -> ! {
        panic!("{e} (one of its functions was called without checking rdma_verbs_sys::dl::load first)")
    }

    /// libibverbs' table, for the wrappers.
    #[inline]
    pub(crate) fn libibverbs() -> &'static LibibverbsFns {
        match ibverbs() {
            Ok(l) => &l.fns,
            Err(e) => unusable(e),
        }
    }

    /// librdmacm's table, for the wrappers.
    #[inline]
    pub(crate) fn librdmacm() -> &'static LibrdmacmFns {
        match rdmacm() {
            Ok(l) => &l.fns,
            Err(e) => unusable(e),
        }
    }
}

#[cfg(feature = "dlopen")]
pub(crate) use imp::{libibverbs, librdmacm};
