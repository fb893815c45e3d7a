// A queue hands a buffer back on the word of a completion and marks the completion taken.
// If a completion could be copied, the copy could be presented again later, when the same
// wr_id names a newer request, and take a buffer the device still writes. It cannot.
use rdma_verbs::WorkCompletion;

fn keep_a_copy(wc: &WorkCompletion) -> WorkCompletion {
    *wc
}

fn keep_a_clone(wc: &WorkCompletion) -> WorkCompletion {
    wc.clone()
}

fn main() {
    let _ = (keep_a_copy, keep_a_clone);
}
