//! The report's vocabulary, which every other part speaks: the report and its facts
//! ([`report`]), the layers and what each concluded ([`layer`]), the counters
//! ([`counters`]), and the one way a file given to the doctor is read ([`input`]). Nothing
//! here reads the node.

pub mod counters;
pub mod input;
pub mod layer;
pub mod report;
