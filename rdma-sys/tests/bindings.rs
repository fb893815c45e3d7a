//! Host-side checks of the bindings themselves: no device needed.
//!
//! bindgen's own layout assertions are `const` items inside the bindings, so every
//! build of this crate (and so every `cargo test`) evaluates them. The tests here add
//! what those cannot: the checked-in copy must match this machine's generation, and a
//! second compiler (the system's C compiler) must agree on the layouts the data path
//! depends on.

use std::mem::{offset_of, size_of};
use std::process::Command;

#[test]
fn checked_in_bindings_match_what_bindgen_generates_here() {
    if rdma_verbs_sys::PREGENERATED {
        panic!("this build copied src/bindings.rs instead of generating it (is DOCS_RS set?)");
    }
    let generated = include_str!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    let checked_in = include_str!("../src/bindings.rs");
    if generated != checked_in {
        let line = generated
            .lines()
            .zip(checked_in.lines())
            .position(|(a, b)| a != b)
            .map_or(generated.lines().count().min(checked_in.lines().count()), |i| i)
            + 1;
        panic!(
            "rdma-sys/src/bindings.rs has drifted from what bindgen generates from this machine's \
             headers (first difference at line {line}). Run scripts/regen-bindings and commit the result."
        );
    }
}

/// Asks the C compiler for `sizeof`/`offsetof` of what the data path touches and
/// compares each number with what Rust sees.
#[test]
fn c_compiler_agrees_on_struct_layouts() {
    use rdma_verbs_sys::*;
    macro_rules! probes {
        ($($c:literal => $rust:expr),* $(,)?) => { vec![$(($c, $rust)),*] };
    }
    let probes: Vec<(&str, usize)> = probes![
        "sizeof(struct ibv_wc)" => size_of::<ibv_wc>(),
        "offsetof(struct ibv_wc, wc_flags)" => offset_of!(ibv_wc, wc_flags),
        "offsetof(struct ibv_wc, src_qp)" => offset_of!(ibv_wc, src_qp),
        "sizeof(struct ibv_sge)" => size_of::<ibv_sge>(),
        "sizeof(struct ibv_send_wr)" => size_of::<ibv_send_wr>(),
        "offsetof(struct ibv_send_wr, wr)" => offset_of!(ibv_send_wr, wr),
        "offsetof(struct ibv_send_wr, qp_type)" => offset_of!(ibv_send_wr, qp_type),
        "sizeof(struct ibv_recv_wr)" => size_of::<ibv_recv_wr>(),
        "sizeof(struct ibv_qp_attr)" => size_of::<ibv_qp_attr>(),
        "offsetof(struct ibv_qp_attr, ah_attr)" => offset_of!(ibv_qp_attr, ah_attr),
        "sizeof(struct ibv_qp_init_attr)" => size_of::<ibv_qp_init_attr>(),
        "sizeof(struct ibv_qp_init_attr_ex)" => size_of::<ibv_qp_init_attr_ex>(),
        "sizeof(struct ibv_cq_init_attr_ex)" => size_of::<ibv_cq_init_attr_ex>(),
        "sizeof(struct ibv_port_attr)" => size_of::<ibv_port_attr>(),
        "sizeof(struct ibv_device_attr)" => size_of::<ibv_device_attr>(),
        "sizeof(struct ibv_gid_entry)" => size_of::<ibv_gid_entry>(),
        "sizeof(struct ibv_context)" => size_of::<ibv_context>(),
        "offsetof(struct ibv_context, abi_compat)" => offset_of!(ibv_context, abi_compat),
        "offsetof(struct ibv_context_ops, post_send)" => offset_of!(ibv_context_ops, post_send),
        "offsetof(struct ibv_context_ops, post_recv)" => offset_of!(ibv_context_ops, post_recv),
        "offsetof(struct ibv_context_ops, poll_cq)" => offset_of!(ibv_context_ops, poll_cq),
        "offsetof(struct ibv_context_ops, req_notify_cq)" => offset_of!(ibv_context_ops, req_notify_cq),
        "offsetof(struct ibv_context_ops, post_srq_recv)" => offset_of!(ibv_context_ops, post_srq_recv),
        "sizeof(struct verbs_context)" => size_of::<verbs_context>(),
        "offsetof(struct verbs_context, query_port)" => offset_of!(verbs_context, query_port),
        "offsetof(struct verbs_context, create_qp_ex)" => offset_of!(verbs_context, create_qp_ex),
        "offsetof(struct verbs_context, create_cq_ex)" => offset_of!(verbs_context, create_cq_ex),
        "offsetof(struct verbs_context, context)" => offset_of!(verbs_context, context),
        "sizeof(struct ibv_qp)" => size_of::<ibv_qp>(),
        "sizeof(struct ibv_cq)" => size_of::<ibv_cq>(),
        "sizeof(struct ibv_srq)" => size_of::<ibv_srq>(),
        "sizeof(struct ibv_mr)" => size_of::<ibv_mr>(),
        "sizeof(struct ibv_qp_ex)" => size_of::<ibv_qp_ex>(),
        "offsetof(struct ibv_qp_ex, wr_start)" => offset_of!(ibv_qp_ex, wr_start),
        "offsetof(struct ibv_qp_ex, wr_set_ud_addr)" => offset_of!(ibv_qp_ex, wr_set_ud_addr),
        "sizeof(struct ibv_cq_ex)" => size_of::<ibv_cq_ex>(),
        "offsetof(struct ibv_cq_ex, start_poll)" => offset_of!(ibv_cq_ex, start_poll),
        "offsetof(struct ibv_cq_ex, read_completion_ts)" => offset_of!(ibv_cq_ex, read_completion_ts),
        "sizeof(struct rdma_cm_id)" => size_of::<rdma_cm_id>(),
        "sizeof(struct rdma_cm_event)" => size_of::<rdma_cm_event>(),
        "sizeof(struct rdma_conn_param)" => size_of::<rdma_conn_param>(),
    ];

    let dir = std::env::temp_dir().join(format!("rdma-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut src = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (expr, _) in &probes {
        src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    src.push_str("  return 0;\n}\n");
    std::fs::write(dir.join("layout.c"), src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-o", "layout", "layout.c"])
        .current_dir(&dir)
        .status()
        .unwrap_or_else(|e| panic!("could not run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "the C compiler failed on the layout probe in {}", dir.display());
    let out = Command::new(dir.join("layout")).output().unwrap();
    let c_values: Vec<usize> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    std::fs::remove_dir_all(&dir).ok();

    assert_eq!(c_values.len(), probes.len());
    let wrong: Vec<String> = probes
        .iter()
        .zip(&c_values)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C says {c}, Rust says {rust}"))
        .collect();
    assert!(wrong.is_empty(), "layouts disagree:\n{}", wrong.join("\n"));
}
