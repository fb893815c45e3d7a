// QpType may grow (raw packet, XRC): a match outside the crate needs a wildcard arm, so a
// new transport is not a breaking change.
use rdma_verbs::QpType;

fn name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "rc",
        QpType::Uc => "uc",
        QpType::Ud => "ud",
    }
}

fn main() {
    println!("{}", name(QpType::Rc));
}
