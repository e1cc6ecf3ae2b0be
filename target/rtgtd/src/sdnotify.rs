//! The systemd service notification protocol (sd_notify(3)): readiness, reloading, stopping,
//! status text and watchdog keep-alives, sent as datagrams to `$NOTIFY_SOCKET`.
//!
//! Without `$NOTIFY_SOCKET` (rtgtd not started by systemd with `Type=notify`) every call is a
//! no-op, so the daemon calls these unconditionally.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

/// A connection to the service manager's notification socket.
pub struct Notifier {
    socket: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID` of this process.
    pub fn from_env() -> io::Result<Notifier> {
        let socket = match std::env::var_os("NOTIFY_SOCKET") {
            Some(path) if !path.is_empty() => {
                let addr = socket_addr(Path::new(&path))?;
                Some((UnixDatagram::unbound()?, addr))
            }
            _ => None,
        };
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Ok(Notifier { socket, watchdog })
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Notifier {
        Notifier {
            socket: None,
            watchdog: None,
        }
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// The watchdog timeout the service manager enforces, when it asked for keep-alives.
    pub fn watchdog(&self) -> Option<Duration> {
        self.socket.as_ref().and(self.watchdog)
    }

    /// Sends `state` (newline-separated `KEY=value` assignments).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        match &self.socket {
            Some((sock, addr)) => sock.send_to_addr(state.as_bytes(), addr).map(|_| ()),
            None => Ok(()),
        }
    }

    /// Sends `state` and logs a failure instead of returning it: notifications must never stop
    /// the daemon.
    pub fn send(&self, state: &str) {
        if let Err(e) = self.notify(state) {
            tracing::warn!(error = %e, "cannot notify the service manager");
        }
    }
}

/// The address of `$NOTIFY_SOCKET`: a path, or an abstract name when it starts with `@`.
fn socket_addr(path: &Path) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
        }
        None => std::os::unix::net::SocketAddr::from_pathname(path),
    }
}

/// The keep-alive timeout from `$WATCHDOG_USEC`, if it is meant for process `pid`.
fn watchdog_interval(usec: Option<&str>, for_pid: Option<&str>, pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(p) = for_pid {
        if p.trim().parse::<u32>().ok() != Some(pid) {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

/// Sends `WATCHDOG=1` at half the manager's timeout for as long as the runtime runs tasks:
/// a wedged runtime stops the keep-alives and systemd restarts the service.
pub fn spawn_watchdog(notifier: std::sync::Arc<Notifier>) -> Option<tokio::task::JoinHandle<()>> {
    let timeout = notifier.watchdog()?;
    tracing::info!(
        timeout_ms = timeout.as_millis() as u64,
        "systemd watchdog enabled"
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(timeout / 2);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            notifier.send("WATCHDOG=1");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_rules() {
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            watchdog_interval(Some("2000000"), Some("7"), 7),
            Some(Duration::from_secs(2))
        );
        assert_eq!(watchdog_interval(Some("2000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
    }

    #[test]
    fn datagrams_reach_path_and_abstract_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier {
            socket: Some((
                UnixDatagram::unbound().unwrap(),
                socket_addr(&path).unwrap(),
            )),
            watchdog: None,
        };
        n.notify("READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");

        let name = format!("@rtgt-notify-test-{}", std::process::id());
        let addr = socket_addr(Path::new(&name)).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), addr)),
            watchdog: Some(Duration::from_secs(1)),
        };
        assert_eq!(n.watchdog(), Some(Duration::from_secs(1)));
        n.notify("STOPPING=1").unwrap();
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1");
    }

    #[test]
    fn without_a_socket_nothing_is_sent() {
        let n = Notifier {
            socket: None,
            watchdog: Some(Duration::from_secs(1)),
        };
        assert!(!n.enabled());
        assert_eq!(n.watchdog(), None);
        n.notify("READY=1").unwrap();
    }
}
