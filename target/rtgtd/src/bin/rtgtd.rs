//! rtgtd: the rtgt storage target daemon.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rtgtd::daemon::{self, Options};

/// Serves SCSI logical units over iSCSI. Without --config it serves the embedded default:
/// LUN 0 on a 1 GiB sparse file in the state directory, open to any initiator.
#[derive(Parser, Debug)]
#[command(name = "rtgtd", version)]
struct Args {
    /// Configuration file (YAML).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Directory for backing files of relative paths, reservations and runtime state.
    #[arg(long, default_value = "rtgt-state")]
    state_dir: PathBuf,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
    /// Print the configured backstore roots (`policy.backstore_roots`), one per line, and
    /// exit; the service's generator makes them writable in its sandbox.
    #[arg(long)]
    print_backstore_roots: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_backstore_roots {
        let config = match &args.config {
            Some(f) => rtgt_api::Config::load(f),
            None => Ok(rtgt_api::Config::embedded_default()),
        };
        return match config {
            Ok(c) => {
                for r in &c.policy.backstore_roots {
                    println!("{}", r.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rtgtd: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rtgtd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = Options {
        config: args.config,
        state_dir: args.state_dir,
    };
    match runtime.block_on(daemon::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", daemon::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}
