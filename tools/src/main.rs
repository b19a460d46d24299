//! The `kvhoard` binary: parses the command line and wires it to the engine.

mod cli;
mod commands;
mod flags;
mod output;
mod plot;
mod replay;
mod size;
mod time;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// Exit code when a key is not found (fsck has its own, e2fsck's).
pub const EXIT_NOT_FOUND: u8 = 3;

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = Cli::parse();
    init_logging(&cli.log_level);
    let defaults = kvhoard_engine::WriterConfig::default();
    let writer = kvhoard_engine::WriterConfig {
        in_flight_bytes: cli.write_in_flight.unwrap_or(defaults.in_flight_bytes),
        request_bytes: cli.write_size.map_or(defaults.request_bytes, |b| b as usize),
        ..defaults
    };
    let base = kvhoard_engine::StoreOptions::default();
    let opts = kvhoard_engine::StoreOptions {
        direct_io: !cli.no_direct_io,
        io_backend: cli.io_backend,
        writer,
        clean_bytes_per_sec: cli.clean_rate.unwrap_or(base.clean_bytes_per_sec),
        ..base
    };
    let result = match cli.command {
        Command::Init { volume, capacity, segment_size, json } => {
            commands::init::run(&volume, capacity, segment_size, json, opts)
        }
        Command::Put { volume, key, file, ns, flags } => {
            commands::keys::put(&volume, &ns.namespace, &key, file.as_deref(), &flags, opts)
        }
        Command::Ns { action } => commands::ns::run(action, opts),
        Command::Replay(args) => replay::run(&args, opts),
        Command::Plan { what: cli::PlanCommand::Capacity(args) } => replay::plan::run(&args, opts),
        Command::Plan { what: cli::PlanCommand::Live(args) } => commands::plan_live::run(&args),
        Command::Ttl(args) => commands::ttl::run(&args),
        Command::Trace { what: cli::TraceCommand::Generate(args) } => replay::generate::generate(&args),
        Command::Trace { what: cli::TraceCommand::Stats { trace, json } } => {
            replay::generate::print_stats(&trace, json)
        }
        Command::Get { volume, key, output, ns, verify } => {
            commands::keys::get(&volume, &ns.namespace, &key, output.as_deref(), verify, opts)
        }
        Command::Rm { volume, key, ns, durability } => {
            commands::keys::rm(&volume, &ns.namespace, &key, durability, opts)
        }
        Command::Stat { volume, json, prometheus } => commands::stat::run(&volume, json, prometheus, opts),
        Command::Ls { volume, ns, limit, after, long, json } => {
            commands::ls::run(&volume, &ns.namespace, limit, after.as_deref(), long, json, opts)
        }
        Command::Mount { volume, mountpoint, threads, durability, dram_tier, allow_other, placement } => {
            let opts = kvhoard_engine::StoreOptions { dram_tier_bytes: dram_tier, ..opts };
            commands::mount::run(&volume, &mountpoint, threads, durability, allow_other, &placement, opts)
        }
        Command::Serve { volume, args } => commands::serve::run(&volume, &args, opts),
        Command::Cluster { action } => commands::cluster::run(&action),
        Command::Fsck { volume, repair, deep, json } => commands::fsck::run(&volume, repair, deep, json, opts),
        Command::Inspect { volume, what, namespace, json } => commands::inspect::run(&volume, what, &namespace, json),
        Command::Demo { dir, blocks, seed, json } => commands::demo::run(dir.as_deref(), blocks, seed, json),
        Command::Bench { suite: Some(crate::cli::BenchSuite::Codecs(args)), .. } => commands::bench_codecs::run(&args),
        Command::Bench { dir: Some(dir), suite: None, flags } => {
            commands::bench::run(&dir, &commands::bench::BenchArgs::new(&flags, &opts))
        }
        Command::Bench { dir: None, .. } => Err(anyhow::anyhow!("bench needs a DIR, or `codecs`")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvhoard: error: {}", plain_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes, joined by ": ", each cause left out when the message before it already
/// says it (library errors often print their source in their own message, and `{:#}` would
/// repeat it: "File exists (os error 17): File exists (os error 17)").
pub fn plain_error(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

/// Rust ignores SIGPIPE, which turns `kvhoard ls | head` into a panic on the first write after
/// `head` exits. A command-line tool should just stop, as every Unix tool does.
fn restore_sigpipe() {
    // SAFETY: called first thing in main, before any thread exists; setting a signal's
    // disposition to SIG_DFL installs no handler code and cannot violate memory safety.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_says_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(17);
        let engine =
            kvhoard_engine::StoreError::File { action: "cannot create directory", path: "v".into(), source: io };
        let e = anyhow::Error::new(engine).context("cannot create a volume at v");
        assert_eq!(
            plain_error(&e),
            "cannot create a volume at v: cannot create directory v: File exists (os error 17)"
        );
        let e = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(plain_error(&e), "outer: middle: inner");
    }
}
