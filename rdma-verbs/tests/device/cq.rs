//! Filled in by the safe-core work.
