//! The user-space library layer (scope `host`): libibverbs and librdmacm load, with every
//! function this build needs. The doctor loads them at run time (rdma-verbs' feature
//! `dlopen`), so a node where rdma-core is missing, unreadable or too old still gets a
//! diagnosis: this layer names the library and its packages, and the kernel layers
//! (device, device nodes, port, link, GID, memlock) are checked all the same. Only the
//! layers that need a library (provider, control and data plane need libibverbs; rdma_cm
//! needs librdmacm too) are skipped, naming it.

use rdma_verbs::ffi::dl::{self, Library};

use crate::facts::libraries::LibraryState;
use crate::model::layer::{Layer, LayerReport};

const SCOPE: &str = "host";
const LAYER: Layer = Layer::Libraries;

/// True when `library` loaded (an empty list, as from a test's expectations, counts as
/// loaded: nothing said otherwise).
pub(crate) fn usable(states: &[LibraryState], library: Library) -> bool {
    states.iter().all(|s| s.library != library || s.outcome.is_ok())
}

/// Why a device layer that needs a missing library is not checked, if one is missing.
pub(crate) fn needs(states: &[LibraryState], layer: Layer) -> Option<String> {
    let wanted: &[Library] = match layer {
        Layer::Provider | Layer::ControlPlane | Layer::DataPlane => &[Library::Ibverbs],
        Layer::RdmaCm => &[Library::Ibverbs, Library::Rdmacm],
        _ => &[],
    };
    let missing = wanted.iter().find(|l| !usable(states, **l))?;
    Some(format!("not checked: {} is not loaded (the {} layer failed)", missing.soname(), LAYER.name()))
}

/// The layer's verdict.
pub(crate) fn check(states: &[LibraryState]) -> LayerReport {
    let mut evidence = Vec::new();
    let mut failed = Vec::new();
    for s in states {
        match &s.outcome {
            Ok(Some(path)) => evidence.push(format!("{}: {path}", s.library.soname())),
            Ok(None) => evidence.push(format!("{}: loaded", s.library.soname())),
            Err(why) => {
                evidence.push(why.clone());
                failed.push(s);
            }
        }
    }
    let how = if dl::DYNAMIC { "loaded at run time" } else { "linked" };
    if failed.is_empty() {
        return LayerReport::pass(SCOPE, LAYER, format!("libibverbs and librdmacm are {how}"), evidence);
    }
    let names: Vec<&str> = failed.iter().map(|s| s.library.soname()).collect();
    let fix = failed.iter().map(|s| format!("install {}", s.library.packages())).collect();
    let debian: Vec<&str> = failed
        .iter()
        .map(|s| match s.library {
            Library::Ibverbs => "libibverbs1 ibverbs-providers",
            Library::Rdmacm => "librdmacm1",
        })
        .collect();
    LayerReport::fail(
        SCOPE,
        LAYER,
        format!(
            "the user-space {} {} could not be used: the kernel layers are still checked, the layers that need \
             {} are not",
            if names.len() == 1 { "library" } else { "libraries" },
            names.join(" and "),
            if names.len() == 1 { "it" } else { "them" },
        ),
        evidence,
        fix,
    )
    .with_command(format!("apt-get install --reinstall {}", debian.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::Outcome;

    fn state(library: Library, outcome: Result<Option<String>, String>) -> LibraryState {
        LibraryState { library, outcome }
    }

    #[test]
    fn both_loaded_passes_with_their_files() {
        let r = check(&[
            state(Library::Ibverbs, Ok(Some("/usr/lib/libibverbs.so.1.14.44.0".into()))),
            state(Library::Rdmacm, Ok(Some("/usr/lib/librdmacm.so.1.3.44.0".into()))),
        ]);
        assert_eq!((r.layer, r.outcome), (Layer::Libraries, Outcome::Pass));
        assert_eq!(
            r.evidence,
            ["libibverbs.so.1: /usr/lib/libibverbs.so.1.14.44.0", "librdmacm.so.1: /usr/lib/librdmacm.so.1.3.44.0"]
        );
    }

    #[test]
    fn a_missing_librdmacm_fails_naming_it_and_skips_only_rdma_cm() {
        let states = [
            state(Library::Ibverbs, Ok(None)),
            state(
                Library::Rdmacm,
                Err("the user-space library librdmacm.so.1 could not be loaded: file too short".into()),
            ),
        ];
        let r = check(&states);
        assert_eq!(r.outcome, Outcome::Fail);
        assert!(r.summary.contains("librdmacm.so.1") && !r.summary.contains("libibverbs"), "{}", r.summary);
        assert!(r.fix[0].contains("librdmacm1"), "{:?}", r.fix);
        assert_eq!(r.command.as_deref(), Some("apt-get install --reinstall librdmacm1"));
        assert_eq!(needs(&states, Layer::Provider), None);
        assert_eq!(needs(&states, Layer::Port), None);
        assert!(needs(&states, Layer::RdmaCm).is_some_and(|w| w.contains("librdmacm.so.1")));
    }

    #[test]
    fn a_missing_libibverbs_skips_what_needs_it_and_keeps_the_kernel_layers() {
        let states = [state(Library::Ibverbs, Err("gone".into())), state(Library::Rdmacm, Err("gone".into()))];
        for layer in [Layer::Provider, Layer::ControlPlane, Layer::DataPlane, Layer::RdmaCm] {
            assert!(needs(&states, layer).is_some_and(|w| w.contains("libibverbs.so.1")), "{layer:?}");
        }
        for layer in [Layer::Device, Layer::DeviceNodes, Layer::Port, Layer::Link, Layer::Gid, Layer::Memlock] {
            assert_eq!(needs(&states, layer), None, "{layer:?}");
        }
    }
}
