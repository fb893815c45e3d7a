// A protection domain is destroyed once: `destroy` takes the handle by value, so a second
// destroy of the same handle does not compile (pyverbs' test_destroy_pd_twice checks that a
// second close does no harm at run time; here it cannot be written).
use rdma_verbs::{Context, ProtectionDomain};

fn main() {
    let ctx = Context::open_first().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    pd.destroy().unwrap();
    pd.destroy().unwrap();
}
