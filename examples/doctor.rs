//! `cargo run --example doctor -- [FLAGS]`: the `rdma-doctor` command (the rdma-doctor
//! crate, `cargo install --path rdma-doctor`), kept under its old name.

fn main() -> std::process::ExitCode {
    rdma_doctor::modes::cli::main()
}
