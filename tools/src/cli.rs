//! What the command-line tools share: logging to stderr, the runtime and the exit status, and
//! block data read from a file or a pattern and written to a file or stdout.

use std::future::Future;
use std::io::Write as _;
use std::path::Path;

/// Logs to stderr at `RUST_LOG`'s level (default: warnings), runs `f` on a runtime (one
/// thread, or worker threads) and exits with status 1 after printing its error as `name: …`.
pub fn main<F>(name: &str, multi_thread: bool, f: F)
where
    F: Future<Output = Result<(), String>>,
{
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let result = match rt {
        Ok(rt) => rt.block_on(f),
        Err(e) => Err(format!("cannot start the runtime: {e}")),
    };
    if let Err(e) = result {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

/// Writes blocks read to `out`, or to stdout.
pub fn write_out(data: &[u8], out: Option<&Path>) -> Result<(), String> {
    match out {
        Some(p) => std::fs::write(p, data).map_err(|e| format!("write {}: {e}", p.display())),
        None => std::io::stdout()
            .write_all(data)
            .map_err(|e| format!("stdout: {e}")),
    }
}

/// The data of a write: `file`'s contents, or `blocks` blocks of `pattern`; a whole number of
/// blocks of `block` bytes.
pub fn data_in(
    file: Option<&Path>,
    pattern: u8,
    blocks: u32,
    block: u32,
) -> Result<Vec<u8>, String> {
    let data = match file {
        Some(p) => std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()))?,
        None => vec![pattern; block as usize * blocks as usize],
    };
    if data.is_empty() || !data.len().is_multiple_of(block as usize) {
        return Err(format!("data length must be a multiple of {block}"));
    }
    Ok(data)
}
