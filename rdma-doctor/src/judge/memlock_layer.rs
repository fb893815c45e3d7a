//! The memlock layer: whether a program can lock the memory it registers.

use crate::model::layer::human;
use crate::model::layer::Layer;
use crate::model::layer::LayerReport;

use crate::model::report::Memlock;

/// The memlock layer for a given limit: fails when registering `need` bytes would fail.
pub fn check_memlock(scope: &str, m: &Memlock, need: u64) -> LayerReport {
    let fmt = |v: Option<u64>| v.map_or_else(|| "unlimited".to_owned(), human);
    let evidence = vec![
        format!("RLIMIT_MEMLOCK soft {}, hard {}", fmt(m.soft_bytes), fmt(m.hard_bytes)),
        format!("CAP_IPC_LOCK: {}", if m.cap_ipc_lock { "yes" } else { "no" }),
    ];
    if m.cap_ipc_lock {
        return LayerReport::pass(scope, Layer::Memlock, "CAP_IPC_LOCK: registration is not limited", evidence);
    }
    match m.soft_bytes {
        Some(limit) if limit < need => LayerReport::fail(
            scope,
            Layer::Memlock,
            format!("memlock limit {} is below the {} registration needs: ibv_reg_mr fails with ENOMEM", human(limit), human(need)),
            evidence,
            vec![
                "raise it for the shell: ulimit -l unlimited (up to the hard limit)".into(),
                "for logins: /etc/security/limits.d/rdma.conf with `* soft memlock unlimited` and `* hard memlock unlimited`".into(),
                "for systemd services: LimitMEMLOCK=infinity; for containers: --ulimit memlock=-1".into(),
            ],
        )
        .with_command(match m.hard_bytes {
            None => "ulimit -l unlimited".to_owned(),
            Some(hard) if hard >= need => format!("ulimit -l {}", hard >> 10),
            Some(_) => "echo '* - memlock unlimited' > /etc/security/limits.d/rdma.conf".to_owned(),
        }),
        _ => LayerReport::pass(scope, Layer::Memlock, format!("memlock limit {} allows registration", fmt(m.soft_bytes)), evidence),
    }
}
