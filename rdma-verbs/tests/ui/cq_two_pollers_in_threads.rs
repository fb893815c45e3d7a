// Two threads cannot poll one CQ at once: both closures would need it mutably.
use rdma_verbs::{CompletionQueue, WorkCompletion};

fn two_pollers(cq: &mut CompletionQueue) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut wcs = [WorkCompletion::EMPTY; 4];
            let _ = cq.poll(&mut wcs);
        });
        s.spawn(|| {
            let mut wcs = [WorkCompletion::EMPTY; 4];
            let _ = cq.poll(&mut wcs);
        });
    });
}

fn main() {
    let _ = two_pollers;
}
