//! Compiles the C reference loops the benches compare the Rust data path with
//! (`benches/c_ref.c`), against the same rdma-core headers rdma-sys binds.

fn main() {
    println!("cargo:rerun-if-changed=benches/c_ref.c");
    // docs.rs has no rdma-core; nothing there runs the benches.
    if std::env::var_os("DOCS_RS").is_some() {
        return;
    }
    let verbs = match pkg_config::Config::new().cargo_metadata(false).probe("libibverbs") {
        Ok(lib) => lib,
        Err(e) => {
            eprintln!("error: pkg-config could not find libibverbs ({e}); run scripts/setup");
            std::process::exit(1);
        }
    };
    let mut build = cc::Build::new();
    build.file("benches/c_ref.c").opt_level(2).warnings(true);
    for dir in &verbs.include_paths {
        build.include(dir);
    }
    build.compile("rv_c_ref");
}
