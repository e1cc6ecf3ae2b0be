//! Engine threads: a shard is an OS thread running a single-threaded tokio runtime. A device
//! whose [`crate::hca::Hca`] runs on a shard has its runner, its connection manager and the
//! fabric connections spawned through [`crate::hca::Hca::spawn`] on that one thread: a
//! received packet, the completion it makes and the fabric's answer are handled where the
//! previous step ran, without waking a thread on another core (work-stealing runtimes move
//! such chains between cores, each hop a cross-core wake-up), and the device lock is never
//! contended by the data path.

use std::io;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A running engine thread; dropping it stops its runtime (and every task on it).
#[derive(Debug)]
pub struct Shard {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
}

impl Shard {
    /// Starts a thread named `name` with a runtime of its own (I/O and timers enabled).
    pub fn start(name: &str) -> io::Result<Shard> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(rt.handle().clone()));
                // Runs the spawned tasks until the shard is dropped.
                let _ = rt.block_on(stopped);
            })?;
        let handle = ready_rx
            .recv()
            .map_err(|_| io::Error::other("the shard thread ended before it started"))??;
        Ok(Shard {
            handle,
            stop: Some(stop),
        })
    }

    /// Spawns on this shard, from any thread or runtime.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_the_shard_thread() {
        let shard = Shard::start("rtgt-test-shard").unwrap();
        let name = shard
            .handle()
            .spawn(async { std::thread::current().name().map(str::to_string) })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("rtgt-test-shard"));
        // Tasks spawned from a shard task stay on the shard.
        let inner = shard
            .handle()
            .spawn(async {
                tokio::spawn(async { std::thread::current().name().map(str::to_string) })
                    .await
                    .unwrap()
            })
            .await
            .unwrap();
        assert_eq!(inner.as_deref(), Some("rtgt-test-shard"));
        // Dropping the shard ends its tasks.
        let (tx, rx) = oneshot::channel::<()>();
        shard.handle().spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await
        });
        drop(shard);
        assert!(tokio::time::timeout(std::time::Duration::from_secs(5), rx)
            .await
            .expect("the shard's task outlived it")
            .is_err());
    }
}
