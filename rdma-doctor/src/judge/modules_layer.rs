//! The kernel_modules layer (scope `host`): the RDMA core modules, their state, and the
//! device driver, told apart from a kernel without RDMA and from a NIC driver whose RDMA
//! part failed to probe (the kernel log line is cited).

use crate::facts::collect::DEVICE_DRIVERS;
use crate::model::layer::{list_or, KernelRdma, Layer, LayerReport};
use crate::model::report::{Baseline, LogError, Observations};

/// The kernel_modules layer: ib_core and ib_uverbs loaded (on a kernel that has them at
/// all: `kernel_rdma`), nothing stuck, and a device driver that probed.
pub(crate) fn check(facts: &Baseline, seen: &Observations, kernel_rdma: &KernelRdma) -> LayerReport {
    const SCOPE: &str = "host";
    let m = &facts.modules;
    let mut evidence: Vec<String> = m.iter().map(|(n, i)| format!("{n}: {}", i.state)).collect();
    let missing: Vec<&str> = ["ib_core", "ib_uverbs"].into_iter().filter(|n| !m.contains_key(*n)).collect();
    if !missing.is_empty() && kernel_rdma.has == Some(false) {
        let release = &facts.kernel.release;
        if let Some(line) = &kernel_rdma.config {
            // Built without it: no module to load or install, whatever the distribution.
            evidence.push(line.clone());
            let file = line.split_once(": ").map_or("/proc/config.gz", |(f, _)| f);
            let grep = if file.ends_with(".gz") { "zgrep" } else { "grep" };
            return LayerReport::fail(
                SCOPE,
                Layer::KernelModules,
                format!("this kernel ({release}) is built without RDMA (CONFIG_INFINIBAND is not set): no module can add it"),
                evidence,
                vec![
                    "boot a kernel built with CONFIG_INFINIBAND and CONFIG_INFINIBAND_USER_ACCESS (a distribution kernel has them as modules); modprobe cannot help".into(),
                ],
            )
            .with_check(format!("{grep} -E 'CONFIG_INFINIBAND(_USER_ACCESS)?[= ]' {file}"));
        }
        return LayerReport::fail(
            SCOPE,
            Layer::KernelModules,
            format!("this kernel ({release}) has no RDMA support: ib_core is neither built in nor among its modules"),
            evidence,
            vec![
                "boot a kernel built with CONFIG_INFINIBAND and CONFIG_INFINIBAND_USER_ACCESS (modprobe cannot help)".into(),
                format!("or install its RDMA modules where the distribution ships them apart (Ubuntu: linux-modules-extra-{release})"),
            ],
        )
        .with_command(match facts.packages.manager.as_deref() {
            Some("dpkg") => format!("apt-get install linux-modules-extra-{release}"),
            _ => format!("grep -E 'CONFIG_INFINIBAND(_USER_ACCESS)?=' /boot/config-{release}"),
        });
    }
    if !missing.is_empty() {
        return LayerReport::fail(
            SCOPE,
            Layer::KernelModules,
            format!("RDMA core module(s) not loaded: {}", missing.join(", ")),
            evidence,
            vec!["modprobe ib_uverbs   # loads ib_core too".into()],
        )
        .with_command("modprobe ib_uverbs");
    }
    let stuck: Vec<String> = m
        .iter()
        .filter(|(_, i)| i.state != "Live" && i.state != "builtin")
        .map(|(n, i)| format!("{n} ({})", i.state))
        .collect();
    if !stuck.is_empty() {
        evidence.extend(seen.kernel_log.errors.iter().map(|e| format!("{} [{}]", e.line, e.meaning)));
        return LayerReport::fail(
            SCOPE,
            Layer::KernelModules,
            format!("module(s) not live: {}", stuck.join(", ")),
            evidence,
            vec!["look at the driver's messages: dmesg | grep -iE 'mlx|rdma|infiniband'".into()],
        )
        .with_command("dmesg | grep -iE 'mlx|rdma|infiniband'");
    }
    let drivers: Vec<&str> = DEVICE_DRIVERS.iter().copied().filter(|d| m.contains_key(*d)).collect();
    if seen.sysfs_devices.is_empty() {
        if let Some(r) = rdma_part_missing(facts, seen, evidence.clone()) {
            return r;
        }
        if drivers.is_empty() {
            return LayerReport::fail(
                SCOPE,
                Layer::KernelModules,
                "no RDMA device driver module is loaded",
                evidence,
                vec![
                    "modprobe mlx5_ib   # NVIDIA ConnectX-4 and later (or the module of your vendor: bnxt_re, irdma, efa, ...)".into(),
                    "SoftRoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <netdev>".into(),
                ],
            )
            .with_command("lspci -nnk | grep -iA3 -E 'mellanox|infiniband|ethernet'");
        }
        // Only the loaded drivers' own lines: another family's error is not theirs.
        let families: Vec<&str> = drivers.iter().map(|d| family(d)).collect();
        let probe: Vec<String> = seen
            .kernel_log
            .errors
            .iter()
            .filter(|e| families.iter().any(|f| e.line.contains(f)))
            .map(|e| format!("{} [{}]", e.line, e.meaning))
            .collect();
        if !probe.is_empty() {
            evidence.extend(probe);
            return LayerReport::fail(
                SCOPE,
                Layer::KernelModules,
                format!("{} loaded but the kernel log reports driver errors and no device appeared", drivers.join(", ")),
                evidence,
                vec![
                    "EBUSY (-16): another driver holds the PCI function, or the firmware is rejected: check `lspci -k`, update the firmware (mlxup / flint)".into(),
                    "ETIMEDOUT (-110): the firmware does not answer: a cold reboot (power cycle) of the host".into(),
                ],
            )
            .with_command("lspci -nnk | grep -iA3 -E 'mellanox|infiniband|ethernet'");
        }
    }
    LayerReport::pass(
        SCOPE,
        Layer::KernelModules,
        format!("ib_core, ib_uverbs and {} loaded", list_or(&drivers, "no device driver")),
        evidence,
    )
}

/// The word a driver's kernel log lines carry: `mlx5` for mlx5_ib, `rxe` for rdma_rxe.
fn family(driver: &str) -> &str {
    let name = driver.strip_prefix("rdma_").unwrap_or(driver);
    name.split('_').next().unwrap_or(name)
}

/// NIC drivers and the module that adds their RDMA device.
const RDMA_PARTS: &[(&str, &str)] =
    &[("mlx5_core", "mlx5_ib"), ("mlx4_core", "mlx4_ib"), ("bnxt_en", "bnxt_re"), ("cxgb4", "iw_cxgb4")];

/// A NIC driver loaded without its RDMA part, and no device: the RDMA part failed to
/// probe when the kernel log says so (the lines of the driver family are cited), else it
/// is not loaded.
fn rdma_part_missing(facts: &Baseline, seen: &Observations, mut evidence: Vec<String>) -> Option<LayerReport> {
    let m = &facts.modules;
    let (core, ib) = RDMA_PARTS.iter().find(|(core, ib)| m.contains_key(*core) && !m.contains_key(*ib))?;
    let family = core.split('_').next().unwrap_or(core);
    let errors: Vec<&LogError> = seen.kernel_log.errors.iter().filter(|e| e.line.contains(family)).collect();
    let Some(first) = errors.first() else {
        return Some(
            LayerReport::fail(
                "host",
                Layer::KernelModules,
                format!("{core} is loaded but its RDMA driver {ib} is not (no probe error in the kernel log read)"),
                evidence,
                vec![format!("modprobe {ib}")],
            )
            .with_command(format!("modprobe {ib}")),
        );
    };
    evidence.extend(errors.iter().map(|e| format!("{} [{}]", e.line, e.meaning)));
    let name = first.meaning.split_once(" (").map_or(first.meaning.as_str(), |(n, _)| n);
    Some(LayerReport::fail(
        "host",
        Layer::KernelModules,
        format!(
            "the RDMA driver failed to probe ({name}, errno {}): {core} is loaded, {ib} is not, and no RDMA device appeared; the kernel log says: {}",
            first.errno, first.line
        ),
        evidence,
        probe_fix(first.errno, ib),
    )
    .with_command(format!("dmesg | grep -iE '{family}'")))
}

/// What to do about a driver that failed to probe with `errno`.
fn probe_fix(errno: i32, module: &str) -> Vec<String> {
    let mut fix = match errno {
        libc::EBUSY => vec![
            "EBUSY: another driver holds the PCI function (lspci -nnk: \"Kernel driver in use\"), or the firmware is rejected: update it (mlxup / flint)".to_owned(),
        ],
        libc::ETIMEDOUT => vec!["ETIMEDOUT: the firmware does not answer: a cold reboot (power cycle) of the host".to_owned()],
        _ => vec!["the driver's messages: dmesg | grep -iE 'mlx|bnxt|cxgb|rdma|infiniband'".to_owned()],
    };
    fix.push(format!("then load it again: modprobe -r {module}; modprobe {module}"));
    fix
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer::Outcome;

    #[test]
    fn a_nic_driver_whose_rdma_part_failed_to_probe_is_diagnosed_citing_the_line_not_an_old_one() {
        let now = 20_000_000_000; // 5.5 hours after boot
        let records = [
            "3,1,20000000,-;mlx5_core 0000:03:00.0: probe_one:1620:(pid 1): mlx5_init_one failed with error -16",
            "3,2,5000000000,-;mlx5_ib: mr_umem_get: umem get failed (-12)",
        ];
        let report: crate::model::report::Report =
            serde_json::from_str(include_str!("../../testdata/node-a.json")).unwrap();
        let mut facts = report.baseline;
        facts.modules.remove("mlx5_ib");
        facts.devices.clear();
        let mut seen = Observations {
            kernel_log: crate::facts::kmsg::filter(records.iter().copied(), 30, crate::facts::kmsg::Window::at(now)),
            ..Observations::default()
        };
        let r = check(&facts, &seen, &YES);
        assert_eq!((r.layer, r.outcome), (Layer::KernelModules, Outcome::Fail));
        assert!(
            r.summary
                .starts_with("the RDMA driver failed to probe (EBUSY, errno 16): mlx5_core is loaded, mlx5_ib is not"),
            "{r:#?}"
        );
        assert!(r.summary.contains("mlx5_init_one failed with error -16"), "{r:#?}");
        assert!(!r.evidence.iter().any(|e| e.contains("umem get failed")), "the old line is not cited: {r:#?}");
        assert!(r.fix[0].starts_with("EBUSY: another driver holds the PCI function"), "{r:#?}");
        assert_eq!(r.command.as_deref(), Some("dmesg | grep -iE 'mlx5'"));
        assert!(!r.summary.contains("no RDMA device driver module"), "{r:#?}");

        // No probe error in the window: the RDMA part is simply not loaded.
        seen.kernel_log.errors.clear();
        let r = check(&facts, &seen, &YES);
        assert!(r.summary.starts_with("mlx5_core is loaded but its RDMA driver mlx5_ib is not"), "{r:#?}");
        assert_eq!(r.fix, ["modprobe mlx5_ib"]);
        assert_eq!(r.command.as_deref(), Some("modprobe mlx5_ib"));
    }

    #[test]
    fn a_loaded_driver_with_no_device_is_blamed_only_for_its_own_log_lines() {
        let records = [
            "3,1,20000000,-;mlx5_core 0000:03:00.0: probe_one:1620:(pid 1): mlx5_init_one failed with error -16",
            "3,2,21000000,-;rdma_rxe: rxe_newlink: failed to add rxe0 (-22)",
        ];
        let mut facts = Baseline::default();
        for m in ["ib_core", "ib_uverbs", "rdma_rxe"] {
            facts
                .modules
                .insert(m.into(), crate::model::report::ModuleInfo { state: "Live".into(), ..Default::default() });
        }
        let mut seen = Observations {
            kernel_log: crate::facts::kmsg::filter(
                records.iter().copied(),
                30,
                crate::facts::kmsg::Window::at(30_000_000),
            ),
            ..Observations::default()
        };
        let r = check(&facts, &seen, &YES);
        assert_eq!(r.outcome, Outcome::Fail, "{r:#?}");
        assert!(r.evidence.iter().any(|e| e.contains("failed to add rxe0 (-22)")), "{r:#?}");
        assert!(!r.evidence.iter().any(|e| e.contains("mlx5_init_one")), "mlx5's line is not rxe's: {r:#?}");
        // Only another family's error: nothing to blame rdma_rxe for.
        seen.kernel_log.errors.retain(|e| e.line.contains("mlx5"));
        assert_eq!(check(&facts, &seen, &YES).outcome, Outcome::Pass);
        assert_eq!((family("rdma_rxe"), family("mlx5_ib"), family("irdma")), ("rxe", "mlx5", "irdma"));
    }

    const YES: KernelRdma = KernelRdma { has: Some(true), config: None };

    #[test]
    fn a_kernel_without_rdma_is_said_so_instead_of_modprobe() {
        let mut facts = Baseline::default();
        facts.kernel.release = "6.18.44-fc".into();
        let no = KernelRdma { has: Some(false), config: None };
        let r = check(&facts, &Observations::default(), &no);
        assert!(r.summary.starts_with("this kernel (6.18.44-fc) has no RDMA support"), "{r:#?}");
        assert!(r.fix.iter().all(|f| !f.starts_with("modprobe")), "{r:#?}");
        // Unknown (no /lib/modules to look in): the modprobe advice stays.
        assert!(
            check(&facts, &Observations::default(), &KernelRdma::default()).fix[0].starts_with("modprobe ib_uverbs")
        );
    }

    #[test]
    fn a_kernel_built_without_config_infiniband_gets_no_modprobe_and_no_package_advice() {
        // This project's host: /proc/config.gz says so, /lib/modules is absent, dpkg is there.
        let mut facts = Baseline::default();
        facts.kernel.release = "6.18.44-fc-v1252".into();
        facts.packages.manager = Some("dpkg".into());
        let built_without =
            KernelRdma { has: Some(false), config: Some("/proc/config.gz: # CONFIG_INFINIBAND is not set".into()) };
        let r = check(&facts, &Observations::default(), &built_without);
        assert_eq!(r.outcome, Outcome::Fail);
        assert!(r.summary.contains("built without RDMA (CONFIG_INFINIBAND is not set)"), "{r:#?}");
        assert!(r.evidence.iter().any(|e| e == "/proc/config.gz: # CONFIG_INFINIBAND is not set"), "{r:#?}");
        assert!(r.fix.iter().all(|f| !f.starts_with("modprobe") && !f.contains("modules-extra")), "{r:#?}");
        assert!(r.fix[0].starts_with("boot a kernel built with CONFIG_INFINIBAND"), "{r:#?}");
        assert_eq!(r.command.as_deref(), Some("zgrep -E 'CONFIG_INFINIBAND(_USER_ACCESS)?[= ]' /proc/config.gz"));
        assert!(r.command_is_check, "showing the config fixes nothing: {r:#?}");
    }
}
