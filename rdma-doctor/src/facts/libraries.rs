//! Whether libibverbs and librdmacm load, with every function this build needs, and the
//! file each came from (rdma-verbs' feature `dlopen`: a node without them still gets its
//! kernel layers checked). [`crate::judge::libraries_layer`] judges what is found here.

use rdma_verbs::ffi::dl::{self, Library};

/// How one library came out, as [`load_all`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryState {
    /// The library.
    pub library: Library,
    /// The file it was loaded from, or why it could not be.
    pub outcome: Result<Option<String>, String>,
}

/// Loads both libraries (a no-op in a linked build) and says where each came from.
pub fn load_all() -> Vec<LibraryState> {
    [Library::Ibverbs, Library::Rdmacm]
        .into_iter()
        .map(|library| LibraryState {
            library,
            outcome: dl::load(library).map_err(|e| e.to_string()).map(|()| {
                dl::address(library).and_then(crate::facts::versions::object_of).map(|p| p.display().to_string())
            }),
        })
        .collect()
}
