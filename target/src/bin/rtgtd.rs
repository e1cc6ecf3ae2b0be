//! rtgtd: the rtgt storage target daemon.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rtgt_target::daemon::{self, Options};

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
}

fn main() -> ExitCode {
    let args = Args::parse();
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
