//! The provider layer: why libibverbs cannot open a device the kernel enumerated, from
//! what [`crate::facts::provider`] found: no config naming the provider, no provider
//! library, one built for another libibverbs, or the kernel refusing (the rdma cgroup).

use crate::facts::provider::os_error;
use crate::facts::provider::ProviderProbe;
use crate::facts::provider::CONFIG_DIR;

use crate::model::layer::{Layer, LayerReport};
use crate::model::report::{Baseline, DeviceFacts};

/// Why the provider did not serve the device.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    /// No config file names the provider: libibverbs never tries it.
    NoConfig(String),
    /// Named, but its library is not there (or libibverbs says it cannot find it).
    NoLibrary(String),
    /// There, but it does not load or claim the device: libibverbs' reason, if it gave one.
    OtherLibibverbs(String, Option<String>),
    /// Listed, and `ibv_open_device` failed with this errno: the kernel refused.
    KernelRefused(i32),
    /// Nothing more specific is known.
    Unknown,
}

fn cause(d: &DeviceFacts, probe: &ProviderProbe) -> Cause {
    if probe.listed {
        // Only ibv_open_device's own errno: a later verb (ibv_query_device) failing is not
        // the open being refused.
        let open = d.open_error.as_deref().filter(|e| e.starts_with("ibv_open_device"));
        return open.and_then(os_error).map_or(Cause::Unknown, Cause::KernelRefused);
    }
    let Some(p) = probe.expected.clone() else { return Cause::Unknown };
    let load = probe.warnings.iter().find(|w| w.contains("couldn't load driver") || w.contains("kernel ABI"));
    // A load failure with the library present is the library's own fault (its symbols, a
    // library it needs), whatever dlerror says.
    match load {
        Some(_) if probe.libraries.is_empty() && !probe.configs.is_empty() => Cause::NoLibrary(p),
        Some(w) => Cause::OtherLibibverbs(p, Some(w.clone())),
        None if probe.configs.is_empty() => Cause::NoConfig(p),
        None if probe.libraries.is_empty() => Cause::NoLibrary(p),
        None => Cause::OtherLibibverbs(p, None),
    }
}

/// The kernel refusing this process a context on device `name` (libibverbs lists it, and
/// `ibv_open_device` fails with an errno: the rdma cgroup's hca_handle limit, the
/// open-file limit, the driver): a failure of the device_nodes layer, the kernel's side of
/// the device, not of the user-space provider; `None` otherwise.
pub(crate) fn kernel_refusal(
    name: &str,
    d: &DeviceFacts,
    facts: &Baseline,
    probe: Option<&ProviderProbe>,
) -> Option<LayerReport> {
    let error = d.open_error.as_ref()?;
    let fallback = ProviderProbe { listed: !error.starts_with("no RDMA device named"), ..ProviderProbe::default() };
    let probe = probe.unwrap_or(&fallback);
    let cause = cause(d, probe);
    let Cause::KernelRefused(errno) = cause else { return None };
    let mut evidence = vec![error.clone()];
    evidence.extend(probe_evidence(probe));
    let (summary, fix) = kernel_refused(name, errno);
    let command = command(name, &cause, facts.packages.manager.as_deref(), true, probe);
    Some(LayerReport::fail(name, Layer::DeviceNodes, summary, evidence, fix).with_command(command))
}

/// The provider layer of device `name`. `probe` is `None` for a report read back from a
/// file: then only the open error is known.
pub fn check(name: &str, d: &DeviceFacts, facts: &Baseline, probe: Option<&ProviderProbe>) -> LayerReport {
    let verbs = facts.libraries.get("libibverbs").and_then(|l| l.version.clone()).unwrap_or_else(|| "unknown".into());
    let mut evidence = vec![format!("libibverbs {verbs}")];
    let Some(error) = &d.open_error else {
        return match &d.provider {
            Some(p) => {
                evidence.push(format!("provider {} in {}", p.name, p.library));
                LayerReport::pass(name, Layer::Provider, format!("opened through provider {}", p.name), evidence)
            }
            None => LayerReport::pass(name, Layer::Provider, "opened (provider library not identified)", evidence),
        };
    };
    evidence.push(error.clone());
    let fallback = ProviderProbe { listed: !error.starts_with("no RDMA device named"), ..ProviderProbe::default() };
    let probe = probe.unwrap_or(&fallback);
    evidence.extend(probe_evidence(probe));
    let package = providers_package(facts);
    if let Some(p) = &package {
        evidence.push(format!("package {p} installed"));
    }
    let cause = cause(d, probe);
    let (summary, fix) = diagnosis(name, d, &cause, package.as_deref(), probe);
    let command = command(name, &cause, facts.packages.manager.as_deref(), package.is_some(), probe);
    LayerReport::fail(name, Layer::Provider, summary, evidence, fix).with_command(command)
}

/// The one command that fixes (or, where the doctor cannot know the fix, shows) `cause`.
fn command(name: &str, cause: &Cause, manager: Option<&str>, installed: bool, probe: &ProviderProbe) -> String {
    let install = match (manager, installed) {
        (Some("rpm"), true) => "dnf reinstall libibverbs",
        (Some("rpm"), false) => "dnf install libibverbs",
        (_, true) => "apt-get install --reinstall ibverbs-providers",
        (_, false) => "apt-get install ibverbs-providers",
    };
    match cause {
        Cause::NoConfig(p) => format!("echo 'driver {p}' > {CONFIG_DIR}/{p}.driver"),
        Cause::NoLibrary(_) | Cause::Unknown => install.to_owned(),
        Cause::OtherLibibverbs(..) => match probe.libraries.first() {
            Some(lib) => format!("ldd {lib}"),
            None => "IBV_SHOW_WARNINGS=1 ibv_devices".to_owned(),
        },
        Cause::KernelRefused(libc::EAGAIN) => crate::judge::verdict::CGROUP_RDMA.to_owned(),
        Cause::KernelRefused(libc::EMFILE | libc::ENFILE) => "ulimit -n \"$(ulimit -Hn)\"".to_owned(),
        Cause::KernelRefused(_) => format!("dmesg | grep -iE 'rdma|infiniband|{name}'"),
    }
}

fn probe_evidence(p: &ProviderProbe) -> Vec<String> {
    let mut out = vec![format!("libibverbs {} the device", if p.listed { "lists" } else { "does not list" })];
    if let Some(e) = &p.expected {
        let configs = if p.configs.is_empty() { "none".to_owned() } else { p.configs.join(", ") };
        out.push(format!("config files in {CONFIG_DIR} naming `driver {e}`: {configs}"));
        let libs = if p.libraries.is_empty() { "none".to_owned() } else { p.libraries.join(", ") };
        out.push(format!("lib{e}-rdmav*.so in {}: {libs}", p.dirs.join(", ")));
    }
    out.extend(p.warnings.iter().map(|w| format!("libibverbs said: {w}")));
    out
}

/// The installed package that ships the providers, with its version (`ibverbs-providers 44.0-2`).
fn providers_package(facts: &Baseline) -> Option<String> {
    ["ibverbs-providers", "libibverbs", "rdma-core"]
        .iter()
        .find_map(|n| facts.packages.versions.get(*n).map(|v| format!("{n} {v}")))
}

fn install_or_reinstall(package: Option<&str>) -> String {
    match package {
        Some(p) => format!(
            "{p} is installed but incomplete: reinstall it (apt-get install --reinstall ibverbs-providers / dnf reinstall libibverbs)"
        ),
        None => "install the providers: apt-get install ibverbs-providers (Debian, Ubuntu) / dnf install libibverbs (RHEL, Fedora)".into(),
    }
}

fn diagnosis(
    name: &str,
    d: &DeviceFacts,
    cause: &Cause,
    package: Option<&str>,
    probe: &ProviderProbe,
) -> (String, Vec<String>) {
    let driver = d.kernel_driver_name.as_deref().unwrap_or("its kernel driver");
    match cause {
        Cause::NoConfig(p) => (
            format!("no provider config: no file in {CONFIG_DIR} says `driver {p}`, so libibverbs never loads the provider for {driver}"),
            vec![format!("echo 'driver {p}' > {CONFIG_DIR}/{p}.driver"), install_or_reinstall(package)],
        ),
        Cause::NoLibrary(p) => (
            format!("provider library missing: {CONFIG_DIR} names `{p}` but lib{p}-rdmav*.so is not in {}", probe.dirs.join(", ")),
            vec![install_or_reinstall(package)],
        ),
        Cause::OtherLibibverbs(p, said) => (
            match said {
                Some(w) => format!("the {p} provider does not load (built for another libibverbs, or a library it needs is missing): {w}"),
                None => format!("the {p} provider is installed but does not claim {name}: built for another libibverbs or too old for this device"),
            },
            vec![
                format!("use the libibverbs and the providers of one rdma-core release: ldd {} ; check LD_LIBRARY_PATH and stale copies (MLNX_OFED, /usr/local)", probe.libraries.first().map_or("PROVIDER.so", String::as_str)),
                "IBV_SHOW_WARNINGS=1 ibv_devices shows libibverbs' own reasons".into(),
            ],
        ),
        Cause::KernelRefused(e) => kernel_refused(name, *e),
        Cause::Unknown => (
            format!("libibverbs cannot open the device (no user-space provider for {driver}, or it refused)"),
            vec![
                install_or_reinstall(package),
                format!("see which provider libibverbs tries: IBV_SHOW_WARNINGS=1 ibv_devices; config files are in {CONFIG_DIR}/"),
            ],
        ),
    }
}

fn kernel_refused(name: &str, errno: i32) -> (String, Vec<String>) {
    let text = std::io::Error::from_raw_os_error(errno);
    match errno {
        libc::EAGAIN => (
            format!("the kernel refused ibv_open_device: EAGAIN ({text}): kernel layer, not user space: the rdma cgroup's hca_handle limit is reached"),
            vec![
                "see the limit and the use of this process's cgroup: cat /sys/fs/cgroup$(cut -d: -f3 /proc/self/cgroup)/rdma.max rdma.current".into(),
                format!("raise it: echo '{name} hca_handle=max' > /sys/fs/cgroup/<cgroup>/rdma.max (or the container's / systemd unit's rdma limit)"),
            ],
        ),
        libc::EMFILE | libc::ENFILE => (
            format!("the kernel refused ibv_open_device: {text}: kernel layer, not user space: the open-file limit is reached"),
            vec!["raise the open-file limit: ulimit -n (LimitNOFILE= for systemd services)".into()],
        ),
        _ => (
            format!("the kernel refused ibv_open_device: {text} (errno {errno}): kernel layer, the driver's reason is in its log"),
            vec![format!("dmesg | grep -iE 'rdma|infiniband|{name}'")],
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::provider::config_drivers;
    use crate::facts::provider::expected_for;
    use crate::facts::provider::relevant_warnings;
    use crate::judge::provider_layer::kernel_refusal;
    use crate::model::layer::Layer;
    use crate::model::layer::LayerReport;
    use crate::model::layer::Outcome;
    use crate::model::report::Baseline;
    use crate::model::report::Report;

    const NOT_LISTED: &str = "no RDMA device named \"mlx5_0\"; available: ";
    const NO_DRIVER: &str =
        "libibverbs: Warning: no userspace device-specific driver found for /sys/class/infiniband_verbs/uverbs0";
    const LIB: &str = "/usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so";

    /// The fixture node (ConnectX-6 Dx on mlx5_core, ibverbs-providers installed) with
    /// device mlx5_0 failing to open with `open_error`.
    fn node(open_error: &str) -> (Baseline, DeviceFacts) {
        let r: Report = serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let mut b = r.baseline;
        b.packages.versions.insert("ibverbs-providers".into(), "44.0-2".into());
        let mut d = b.devices["mlx5_0"].clone();
        d.open_error = Some(open_error.into());
        d.provider = None;
        (b, d)
    }

    fn probe(configs: &[&str], libraries: &[&str], stderr: &str) -> ProviderProbe {
        ProviderProbe {
            listed: false,
            expected: Some("mlx5".into()),
            configs: configs.iter().map(|s| s.to_string()).collect(),
            dirs: vec!["/usr/lib/x86_64-linux-gnu/libibverbs".into()],
            libraries: libraries.iter().map(|s| s.to_string()).collect(),
            warnings: relevant_warnings(stderr, Some("mlx5"), Some("uverbs0")),
        }
    }

    fn no_install_advice(r: &LayerReport) {
        assert!(!r.fix.iter().any(|f| f.contains("apt-get install ibverbs-providers")), "{r:#?}");
    }

    #[test]
    fn a_missing_provider_config_is_named_with_libibverbs_words_and_no_install_advice() {
        let (b, d) = node(NOT_LISTED);
        let r = check("mlx5_0", &d, &b, Some(&probe(&[], &[LIB], NO_DRIVER)));
        assert_eq!(r.outcome, Outcome::Fail);
        assert!(r.summary.starts_with("no provider config: no file in /etc/libibverbs.d says `driver mlx5`"), "{r:#?}");
        assert!(r.evidence.iter().any(|e| e == &format!("libibverbs said: {NO_DRIVER}")), "{r:#?}");
        assert_eq!(r.fix[0], "echo 'driver mlx5' > /etc/libibverbs.d/mlx5.driver");
        assert!(r.fix[1].contains("ibverbs-providers 44.0-2 is installed but incomplete: reinstall"), "{r:#?}");
        no_install_advice(&r);
    }

    #[test]
    fn a_missing_provider_library_is_told_from_a_missing_config() {
        let (b, d) = node(NOT_LISTED);
        let said = "libibverbs: Warning: couldn't load driver 'libmlx5-rdmav34.so': libmlx5-rdmav34.so: \
                    cannot open shared object file: No such file or directory\n";
        let r = check("mlx5_0", &d, &b, Some(&probe(&["/etc/libibverbs.d/mlx5.driver"], &[], said)));
        assert!(r.summary.starts_with("provider library missing: /etc/libibverbs.d names `mlx5`"), "{r:#?}");
        assert!(r.evidence.iter().any(|e| e.contains("couldn't load driver 'libmlx5-rdmav34.so'")), "{r:#?}");
        no_install_advice(&r);
        // The same without a package database: then installing is the advice.
        let (mut b, d) = node(NOT_LISTED);
        b.packages.versions.clear();
        let r = check("mlx5_0", &d, &b, Some(&probe(&["/etc/libibverbs.d/mlx5.driver"], &[], "")));
        assert!(r.summary.starts_with("provider library missing"), "{r:#?}");
        assert!(r.fix[0].starts_with("install the providers: apt-get install ibverbs-providers"), "{r:#?}");
    }

    #[test]
    fn a_provider_built_for_another_libibverbs_quotes_libibverbs_reason() {
        let (b, d) = node(NOT_LISTED);
        let said = format!(
            "libibverbs: Warning: couldn't load driver '{LIB}': {LIB}: version `IBVERBS_PRIVATE_34' not found \
             (required by {LIB})\nlibibverbs: Warning: couldn't load driver 'libvmw_pvrdma-rdmav34.so': gone\n{NO_DRIVER}\n"
        );
        let p = probe(&["/etc/libibverbs.d/mlx5.driver"], &[LIB], &said);
        assert_eq!(p.warnings.len(), 2, "another provider's line is not this device's: {p:#?}");
        let r = check("mlx5_0", &d, &b, Some(&p));
        assert!(r.summary.starts_with("the mlx5 provider does not load (built for another libibverbs"), "{r:#?}");
        assert!(r.summary.contains("version `IBVERBS_PRIVATE_34' not found"), "{r:#?}");
        assert!(
            r.fix[0].starts_with(&format!("use the libibverbs and the providers of one rdma-core release: ldd {LIB}"))
        );
        no_install_advice(&r);
    }

    #[test]
    fn eagain_from_ibv_open_device_is_the_kernel_and_the_rdma_cgroup_not_user_space() {
        let (b, d) = node("ibv_open_device failed (control plane: libibverbs -> kernel driver): Resource temporarily unavailable (os error 11)");
        let p = ProviderProbe { listed: true, ..probe(&["/etc/libibverbs.d/mlx5.driver"], &[LIB], "") };
        // Filed under the kernel's side of the device, not the provider.
        let k = kernel_refusal("mlx5_0", &d, &b, Some(&p)).expect("the kernel refused");
        assert_eq!((k.layer, k.outcome), (Layer::DeviceNodes, Outcome::Fail));
        assert!(k.summary.starts_with("the kernel refused ibv_open_device: EAGAIN"), "{k:#?}");
        assert!(k.command.as_deref().is_some_and(|c| c.contains("rdma.max")) && k.command_is_check, "{k:#?}");
        let r = check("mlx5_0", &d, &b, Some(&p));
        assert!(r.summary.starts_with("the kernel refused ibv_open_device: EAGAIN"), "{r:#?}");
        assert!(r.summary.contains("kernel layer, not user space") && r.summary.contains("rdma cgroup"), "{r:#?}");
        assert!(r.fix.iter().any(|f| f.contains("rdma.max") && f.contains("mlx5_0 hca_handle=max")), "{r:#?}");
        no_install_advice(&r);
        // From a saved report (no probe): the errno and the listing still tell it.
        assert!(check("mlx5_0", &d, &b, None).summary.contains("rdma cgroup"));
        let (b, d) = node(
            "ibv_open_device failed (control plane: libibverbs -> kernel driver): Too many open files (os error 24)",
        );
        assert!(check("mlx5_0", &d, &b, Some(&p)).summary.contains("open-file limit"));
        // Another verb's EAGAIN after the open is not the open refused.
        let (b, d) = node("ibv_query_device failed (control plane: libibverbs -> kernel driver): Resource temporarily unavailable (os error 11)");
        assert!(!check("mlx5_0", &d, &b, Some(&p)).summary.contains("refused ibv_open_device"));
        assert_eq!(kernel_refusal("mlx5_0", &d, &b, Some(&p)), None);
    }

    #[test]
    fn the_provider_layer_of_the_verdict_uses_the_probe() {
        let (mut b, d) = node(NOT_LISTED);
        b.devices.insert("mlx5_0".into(), d);
        let seen = crate::model::report::Observations { sysfs_devices: vec!["mlx5_0".into()], ..Default::default() };
        let mut want = crate::judge::verdict::Expectations {
            devices: vec!["mlx5_0".into()],
            memlock_need: 1 << 20,
            ..Default::default()
        };
        want.providers.insert("mlx5_0".into(), probe(&[], &[LIB], NO_DRIVER));
        let (layers, _) = crate::judge::verdict::evaluate(&b, &seen, &want, &mut crate::judge::verdict::Probes::none());
        let f = layers.iter().find(|l| l.outcome == Outcome::Fail).unwrap();
        assert_eq!(f.layer, Layer::Provider);
        assert!(f.summary.starts_with("no provider config"), "{f:#?}");
    }

    #[test]
    fn config_files_errnos_and_drivers_are_read_without_panicking() {
        assert_eq!(config_drivers("# c\ndriver mlx5\n  driver\tmlx4 extra\ndriver\nbogus x\n"), ["mlx5", "mlx4"]);
        assert_eq!(os_error("x: Resource temporarily unavailable (os error 11)"), Some(11));
        assert_eq!(os_error("(os error )"), None);
        assert_eq!(os_error("(os error 99999999999)"), None);
        assert_eq!(expected_for(Some("mlx5_core"), "mlx5_0"), Some("mlx5"));
        assert_eq!(expected_for(None, "rxe0"), Some("rxe"));
        assert_eq!(expected_for(Some("nvme"), "x"), None);
    }
}
