//! rdma-core's libraries hidden from a process (a bind mount of /dev/null over the file
//! the loader resolves, in a private mount namespace): built with the feature `dlopen`
//! (as `scripts/test` builds the workspace: rdma-doctor turns it on), the entry points
//! return `Error::Library` naming the library, and what does not need it still works;
//! linked, the process does not start at all (the loader stops it, exit 127).

use std::process::Command;

use rdma_test_support::{resolved_library, this_test, LeakCheck};
use rdma_verbs::ffi::dl::{Library, DYNAMIC};
use rdma_verbs::{Context, Error};

const HIDDEN: &str = "RDMA_VERBS_TEST_HIDDEN";

/// In the child: what the safe API says with `library` unusable.
fn child(library: Library) {
    let refused = |what: &str, e: Option<Error>| {
        let e = e.unwrap_or_else(|| panic!("{what}: succeeded with {} hidden", library.soname()));
        let Error::Library(load) = &e else { panic!("{what}: not Error::Library: {e:?}") };
        assert_eq!(load.library(), library, "{what}: {e}");
        let text = e.to_string();
        assert!(text.contains(library.soname()) && text.contains("file too short"), "{what}: {text}");
        println!("REFUSED {what}: {text}");
    };
    match library {
        Library::Ibverbs => {
            refused("devices", rdma_verbs::devices().err());
            refused("Context::open", Context::open(None).err());
            refused("EventChannel::new", rdma_verbs::EventChannel::new().err());
            assert_eq!(rdma_verbs::fork_status(), rdma_verbs::ForkStatus::Disabled);
        }
        Library::Rdmacm => {
            // Verbs work: the device opens and a PD is made.
            let ctx =
                Context::open(Some(&rdma_test_support::device_name())).expect("open the device without librdmacm");
            rdma_verbs::ProtectionDomain::new(&ctx).expect("a PD without librdmacm");
            refused("EventChannel::new", rdma_verbs::EventChannel::new().err());
        }
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it on rxe"]
fn a_hidden_library_is_error_library_naming_it_with_dlopen_and_stops_a_linked_program_before_main() {
    if let Ok(which) = std::env::var(HIDDEN) {
        child(if which == "libibverbs.so.1" { Library::Ibverbs } else { Library::Rdmacm });
        return;
    }
    let _leaks = LeakCheck::new();
    let me = std::env::current_exe().expect("this test binary");
    for library in [Library::Ibverbs, Library::Rdmacm] {
        let file = resolved_library(library.soname());
        let script = format!(
            "mount --bind /dev/null '{}' && exec '{}' --exact '{}' --include-ignored --nocapture --test-threads=1",
            file.display(),
            me.display(),
            this_test!()
        );
        let out = Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .env(HIDDEN, library.soname())
            .output()
            .expect("run unshare");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{library}: {stdout}{stderr}");
        if DYNAMIC {
            assert!(out.status.success(), "{library}: {stdout}{stderr}");
            assert!(stdout.contains("REFUSED EventChannel::new"), "{library}: {stdout}");
        } else {
            assert_eq!(out.status.code(), Some(127), "{library}: {stdout}{stderr}");
            assert!(stderr.contains("error while loading shared libraries"), "{library}: {stderr}");
        }
    }
}
