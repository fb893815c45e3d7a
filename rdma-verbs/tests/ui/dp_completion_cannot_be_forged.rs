// A work completion is what the device reported. If safe code could make one up, it could
// hand a queue a completion for a request still in flight (the wr_id is a sequence number
// and the QP number is public) and get the buffer back while the device still writes it.
use rdma_verbs::{ffi, WorkCompletion};

fn forge(qp_num: u32, wr_id: u64) -> WorkCompletion {
    let raw = ffi::ibv_wc { wr_id, qp_num, ..Default::default() };
    WorkCompletion::from_raw(raw)
}

fn main() {
    let _ = forge;
}
