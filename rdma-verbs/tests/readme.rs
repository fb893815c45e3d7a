//! The README's program is the crate's quickstart, which the device tests run on rxe
//! (`tests/device/doc/quickstart.rs`): so the first program a newcomer copies is one
//! that is known to work.

use std::path::Path;

#[test]
fn the_readme_program_is_the_device_tested_quickstart_word_for_word() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(dir.join("../README.md")).expect("the repository's README.md");
    let quickstart = std::fs::read_to_string(dir.join("tests/device/doc/quickstart.rs")).expect("the quickstart");
    let start = readme.find("```rust\n").expect("a ```rust block in the README") + "```rust\n".len();
    let len = readme[start..].find("```").expect("the end of the README's ```rust block");
    assert_eq!(
        &readme[start..start + len],
        quickstart,
        "README.md's program and tests/device/doc/quickstart.rs differ"
    );
}
