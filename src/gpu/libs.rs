//! Finding and preloading the CUDA libraries (placeholder: finds nothing in this tree).

use std::path::PathBuf;

/// A CUDA library that gpumux loads at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaLib {
    Driver,
    Nvrtc,
    Cublas,
}

/// A library that could not be found.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{lib} not found; searched {searched}")]
pub struct LibError {
    pub lib: String,
    pub searched: String,
}

/// Finds and loads `lib`. This placeholder never finds one.
pub fn preload(lib: CudaLib) -> Result<PathBuf, LibError> {
    Err(LibError {
        lib: format!("{lib:?}"),
        searched: "nothing (library search is not built in this tree)".into(),
    })
}

/// The folders searched for the CUDA libraries. This placeholder searches none.
pub fn search_dirs() -> Vec<PathBuf> {
    Vec::new()
}
