//! `rdma-doctor`: see the library's `cli` module (and `rdma-doctor --help`).

fn main() -> std::process::ExitCode {
    rdma_doctor::modes::cli::main()
}
