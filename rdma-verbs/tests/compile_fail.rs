//! What the types forbid, proven by programs that must not compile (tests/ui/*.rs, each
//! with the compiler's expected complaint beside it).

#[test]
fn misuse_does_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
