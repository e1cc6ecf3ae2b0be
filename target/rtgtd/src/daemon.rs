//! The `rtgtd` daemon: builds the running target from a configuration, serves it and shuts
//! down gracefully.

use std::os::unix::fs::DirBuilderExt;

use std::sync::Arc;
use std::time::Duration;

use rtgt_api::config::{self, Config};
use rtgt_backstore::policy::BackstoreRoots;
use rtgt_transport::hca::Hca;
use tracing::{error, info, warn};

use crate::sdnotify::{self, Notifier};
use rtgt_iscsi::iser::IserServer;
use rtgt_iscsi::IscsiServer;

pub use crate::build::{
    build, config_file, error_chain, load_config, DaemonError, Options, Running,
};

/// How long in-flight commands may take to finish at shutdown before they are aborted.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Logs the live iSER connections, RC QPs and sessions on SIGUSR1 (a leak check the host can
/// read from the log).
async fn report_rdma(iser: IserServer, mut stop: tokio::sync::watch::Receiver<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut usr1) = signal(SignalKind::user_defined1()) else {
        return;
    };
    loop {
        tokio::select! {
            _ = usr1.recv() => {
                let st = iser.stats();
                info!(
                    iser_connections = st.connections.load(std::sync::atomic::Ordering::Acquire),
                    iser_accepted = st.accepted.load(std::sync::atomic::Ordering::Relaxed),
                    rdma_qps = iser.live_qps(),
                    sessions = iser.session_count(),
                    "RDMA state"
                );
            }
            r = stop.changed() => {
                if r.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}

/// Waits for SIGTERM or SIGINT; on each SIGHUP applies the configuration file in between.
async fn serve_signals(opts: &Options, notifier: &Notifier, api: &rtgt_api::server::Api) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install the SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install the SIGINT handler");
    let mut hup = signal(SignalKind::hangup()).expect("install the SIGHUP handler");
    loop {
        tokio::select! {
            _ = term.recv() => return info!("SIGTERM: shutting down"),
            _ = int.recv() => return info!("SIGINT: shutting down"),
            _ = hup.recv() => {
                notifier.send(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
                reload(opts, api).await;
                notifier.send("READY=1\nSTATUS=serving");
            }
        }
    }
}

/// CLOCK_MONOTONIC in microseconds, as sd_notify's RELOADING=1 wants it.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, owned `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// SIGHUP: applies the configuration file (the one rtgtd was started with, or the one it
/// saves in the state directory) as `PUT /api/v1/config` would: only what differs changes,
/// and a file that does not validate leaves everything as it is.
async fn reload(opts: &Options, api: &rtgt_api::server::Api) {
    let file = config_file(opts);
    if opts.config.is_none() && !file.exists() {
        return info!("SIGHUP: running on the embedded default, nothing to reload");
    }
    let config = match Config::load(&file) {
        Ok(c) => c,
        Err(e) => {
            return error!(
                config = %file.display(),
                error = %error_chain(&e),
                "SIGHUP: configuration rejected, keeping the running one"
            )
        }
    };
    match api.apply(config).await {
        Ok(report) => {
            for c in &report.changes {
                info!(action = %c.action, object = %c.object, name = %c.name, "SIGHUP: changed");
            }
            info!(config = %file.display(), changes = report.changes.len(), "SIGHUP: configuration applied");
        }
        Err(e) => error!(
            config = %file.display(),
            error = %e,
            "SIGHUP: configuration not applied, keeping the running one"
        ),
    }
}

/// Exports the soft-RoCE device's and its connection manager's counters at /metrics.
fn export_rdma_counters(control: &crate::control::DaemonControl, hca: &Arc<Hca>) {
    let name = hca.device().name().to_string();
    let hca = hca.clone();
    control.add_rdma_device(
        &name,
        Box::new(move || {
            let d = hca.stats();
            let cm = hca.cm().stats();
            let msgs = |m: &rtgt_transport::cm::MsgCounts| {
                m.req + m.mra + m.rej + m.rep + m.rtu + m.dreq + m.drep + m.other
            };
            crate::control::RdmaCounters {
                rx_packets: d.rx_packets,
                tx_packets: d.tx_packets,
                rx_dropped: d.rx_dropped,
                icrc_errors: d.rx_bad_icrc,
                retransmits: d.retransmits,
                naks_sent: d.naks_sent,
                rnr_naks_sent: d.rnr_naks_sent,
                passed_on: d.rx_passed,
                placed: d.rx_placed,
                cm_events: msgs(&cm.sent) + msgs(&cm.received),
            }
        }),
    );
}

/// Warns about backstore roots rtgtd cannot create files in. Under systemd the unit makes
/// the file system read-only but for the paths it lists, generated from the configuration
/// when the unit is loaded.
fn warn_unwritable_roots(roots: &BackstoreRoots) {
    for (root, e) in roots.unwritable() {
        warn!(
            root = %root.display(),
            error = %e,
            "backstore root is missing or read-only for rtgtd: file backstores cannot be created in it \
             (under systemd: `systemctl daemon-reload`, then restart rtgtd, so that the unit's \
             ReadWritePaths include it)"
        );
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(opts: Options) -> Result<(), DaemonError> {
    // It holds the API tokens, the configuration and backing files: only rtgtd's user
    // may enter a state directory rtgtd creates.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&opts.state_dir)
        .map_err(|source| DaemonError::StateDir {
            dir: opts.state_dir.clone(),
            source,
        })?;
    let config = load_config(&opts)?;
    // The policy is the one rtgtd starts with: the API cannot widen it.
    let roots = BackstoreRoots::new(&opts.state_dir, &config.policy.backstore_roots);
    warn_unwritable_roots(&roots);
    let running = build(&config, &opts.state_dir, &roots).await?;
    let server = Arc::new(IscsiServer::new(
        running.registry.clone(),
        running.pool.clone(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics = rtgt_api::metrics::Metrics::new();
    running.registry.set_metrics(Arc::new(metrics.clone()));
    let explicit_api = config.api != config::ApiConfig::default();
    let api_config = config.api.clone();
    let control = crate::control::DaemonControl::new(crate::control::ControlParts {
        state_dir: opts.state_dir.clone(),
        roots,
        file: config_file(&opts),
        config,
        registry: running.registry.clone(),
        server: (*server).clone(),
        pool: running.pool.clone(),
        device_registry: running.device_registry.clone(),
        devices: running.devices.clone(),
        backstores: running.backstores.clone(),
        metrics,
        rdma: running.rdma.clone(),
    });
    if let Some(hca) = running.rdma.as_ref().and_then(|r| r.hca()) {
        export_rdma_counters(&control, hca);
    }
    control.start_portals().await.map_err(DaemonError::Portal)?;
    control.start_nvme().await.map_err(DaemonError::Portal)?;
    let mut tasks = Vec::new();
    control.start_rdma_services().await;
    if let Some(iser) = control.iser() {
        tasks.push(tokio::spawn(report_rdma(iser.clone(), stop_rx.clone())));
    }
    let (api_tasks, api) =
        crate::control::serve_api(control.clone(), &api_config, explicit_api, stop_rx.clone())
            .await?;
    for t in running.registry.targets() {
        info!(target = %t.name, "target ready");
    }
    let notifier = Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        warn!(error = %e, "NOTIFY_SOCKET unusable: not notifying the service manager");
        Notifier::disabled()
    }));
    let watchdog = sdnotify::spawn_watchdog(notifier.clone());
    notifier.send(&format!(
        "READY=1\nSTATUS=serving {} targets on {} portals",
        running.registry.targets().len(),
        running.portals.len()
    ));

    serve_signals(&opts, &notifier, &api).await;
    notifier.send("STOPPING=1\nSTATUS=stopping");
    if let Some(w) = watchdog {
        w.abort();
    }
    let _ = stop_tx.send(true);
    if let Some(srp) = control.srp() {
        srp.shutdown(SHUTDOWN_GRACE).await;
    }
    server.shutdown(SHUTDOWN_GRACE).await;
    control.stop_nvme().await;
    if let Some(iser) = control.iser() {
        iser.drain(Duration::from_secs(5)).await;
    }
    control.stop_portals().await;
    for t in tasks.into_iter().chain(api_tasks) {
        let _ = t.await;
    }
    if let Some(hca) = running.rdma.as_ref().and_then(|r| r.hca()) {
        hca.shutdown();
    }
    control.flush_all().await;
    info!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The command statistics of the target core reach the daemon's metric registry.

    use std::sync::Arc;

    use rtgt_scsi::core::{LiveLuns, Registry};
    use rtgt_scsi::{Command, LunMap, Status};

    fn device(
        name: &str,
        pool: &Arc<rtgt_backstore::BufPool>,
        size: u64,
    ) -> Arc<rtgt_scsi::Device> {
        rtgt_scsi::Device::new(
            Arc::new(rtgt_backstore::RamBackstore::new(size, 512)),
            pool.clone(),
            rtgt_scsi::DeviceConfig {
                name: name.into(),
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn cmd(cdb: &[u8], in_len: u32) -> Command {
        Command {
            cdb: cdb.into(),
            data_out: None,
            expected_in_len: in_len,
            attr: Default::default(),
            tag: 1,
        }
    }

    #[tokio::test]
    async fn replace_map_and_count_commands() {
        let pool = rtgt_backstore::BufPool::new(8 << 20);
        let registry = Registry::new();
        let metrics = rtgt_api::metrics::Metrics::new();
        registry.set_metrics(Arc::new(metrics.clone()));
        let d0 = device("d0", &pool, 1 << 20);
        let d1 = device("d1", &pool, 2 << 20);
        let mut map = LunMap::default();
        map.luns.insert(0, d0.clone());
        let live = LiveLuns::new(
            map.clone(),
            Some(registry.clone()),
            Some(vec![("session", "s1".into())]),
        );
        let nexus = rtgt_iscsi::session::make_nexus(
            "iqn.2025-01.io.rtgt:i",
            &[0; 6],
            "t",
            1,
            rtgt_scsi::core::PortIds::alone(1),
        );
        let tur = [0u8; 6];
        // The first command of a nexus reports POWER ON; the second succeeds.
        let r = live.execute(&nexus, 0, cmd(&tur, 0)).await;
        assert_eq!(r.status, Status::CheckCondition);
        assert_eq!(
            live.execute(&nexus, 0, cmd(&tur, 0)).await.status,
            Status::Good
        );
        assert!(!live.current().contains(1));
        let unmapped = live.execute(&nexus, 1, cmd(&tur, 0)).await;
        assert_eq!(unmapped.status, Status::CheckCondition);

        map.luns.insert(1, d1.clone());
        let old = live.replace(map);
        assert!(!old.contains(1));
        assert!(live.current().contains(1));
        let rc10 = [0x25u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut r = live.execute(&nexus, 1, cmd(&rc10, 8)).await;
        if r.status == Status::CheckCondition {
            r = live.execute(&nexus, 1, cmd(&rc10, 8)).await;
        }
        assert_eq!(r.status, Status::Good);
        let d = r.data_in.unwrap();
        assert_eq!(
            u32::from_be_bytes(d[0..4].try_into().unwrap()),
            (2 << 20) / 512 - 1
        );

        let text = metrics.render();
        assert!(
            text.contains("rtgt_lun_commands_total{backstore=\"d0\",class=\"other\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("rtgt_lun_errors_total{backstore=\"d0\",sense_key=\"unit_attention\"} 1")
        );
        assert!(text
            .contains("rtgt_session_errors_total{session=\"s1\",sense_key=\"illegal_request\"} 1"));
        assert!(text.contains("rtgt_lun_read_bytes_total{backstore=\"d1\"} 8"));
        assert!(text.contains("rtgt_lun_latency_seconds_count{backstore=\"d1\",class=\"other\"}"));
    }
}
