//! `kvhoard fsck`: check a volume and optionally repair it. Exit codes as e2fsck's.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvhoard_engine::check::{Problem, Report, Severity};
use kvhoard_engine::fsck::{exit, fsck, FsckOptions};
use kvhoard_engine::StoreOptions;
use serde_json::json;

use crate::size::human;

pub fn run(volume: &Path, repair: bool, deep: bool, json: bool, store: StoreOptions) -> anyhow::Result<ExitCode> {
    let show = !json && std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(
        None,
        if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() },
    );
    if let Ok(style) = ProgressStyle::with_template("checking segments [{bar:30}] {pos}/{len}") {
        bar.set_style(style.progress_chars("=> "));
    }
    let started = Instant::now();
    let outcome = fsck(volume, &FsckOptions { repair, deep, store }, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            if json {
                println!("{}", json!({ "exit_code": exit::OPERATIONAL, "error": e.to_string() }));
            }
            eprintln!("kvhoard fsck: cannot check {}: {e}", volume.display());
            return Ok(ExitCode::from(exit::OPERATIONAL));
        }
    };
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if json {
        let out = json!({
            "volume": volume.display().to_string(),
            "exit_code": outcome.exit_code,
            "clean": outcome.found.is_clean(),
            "found": report_json(&outcome.found),
            "repairs": outcome.repairs,
            "after_repair": outcome.after.as_ref().map(report_json),
            "elapsed_ms": elapsed_ms,
        });
        println!("{out}");
    } else {
        print_report(volume, &outcome.found, elapsed_ms);
        if !outcome.repairs.is_empty() {
            println!("\nrepair:");
            outcome.repairs.iter().for_each(|r| println!("  - {r}"));
        }
        if let Some(after) = &outcome.after {
            let verdict = if after.is_clean() {
                "clean".to_string()
            } else {
                format!("{} problems remain", after.count(Severity::Warning))
            };
            println!("\nafter repair: {verdict}");
            after.problems.iter().filter(|p| p.severity >= Severity::Warning).for_each(print_problem);
        } else if !outcome.found.is_clean() {
            println!("\nrun `kvhoard fsck --repair {}` to repair", volume.display());
        }
    }
    Ok(ExitCode::from(outcome.exit_code))
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

fn problem_json(p: &Problem) -> serde_json::Value {
    json!({
        "severity": severity(p.severity),
        "kind": p.kind,
        "segment": p.segment,
        "offset": p.offset,
        "namespace": p.namespace,
        "key": p.key,
        "detail": p.detail,
        "meaning": p.meaning,
    })
}

fn report_json(r: &Report) -> serde_json::Value {
    json!({
        "errors": r.count(Severity::Error),
        "warnings": r.count(Severity::Warning) - r.count(Severity::Error),
        "problems": r.problems.iter().map(problem_json).collect::<Vec<_>>(),
        "segments_in_use": r.segments_in_use,
        "records": r.records,
        "keys": r.keys,
        "blocks": r.blocks,
        "dead_records": r.dead_records,
        "dead_bytes": r.dead_bytes,
        "bytes_read": r.bytes_read,
        "checkpoint_seq": r.checkpoint_seq,
        "lost_keys": r.lost_keys.iter().map(|(ns, k)| json!({ "namespace": ns, "key": k })).collect::<Vec<_>>(),
    })
}

fn print_problem(p: &Problem) {
    let mut at = Vec::new();
    if let Some(s) = p.segment {
        at.push(format!("segment {s}"));
    }
    if let Some(o) = p.offset {
        at.push(format!("offset {o}"));
    }
    if let Some(ns) = &p.namespace {
        at.push(format!("namespace {ns:?}"));
    }
    if let Some(k) = &p.key {
        at.push(format!("key {k:?}"));
    }
    let at = if at.is_empty() { String::new() } else { format!(" [{}]", at.join(", ")) };
    println!("{:<7} {}{at}", severity(p.severity), p.detail);
    println!("        -> {}", p.meaning);
}

fn print_report(volume: &Path, r: &Report, elapsed_ms: u64) {
    let errors = r.count(Severity::Error);
    let warnings = r.count(Severity::Warning) - errors;
    println!(
        "{}: {} segments in use, {} records, {} keys naming {} blocks; read {} in {elapsed_ms} ms",
        volume.display(),
        r.segments_in_use,
        r.records,
        r.keys,
        r.blocks,
        human(r.bytes_read)
    );
    println!(
        "checkpoint {}; {} dead records ({}) awaiting reclaim",
        r.checkpoint_seq.map_or("none usable".to_string(), |c| format!("#{c}")),
        r.dead_records,
        human(r.dead_bytes)
    );
    if r.is_clean() {
        println!("clean");
    } else {
        println!("{errors} errors, {warnings} warnings:");
    }
    r.problems.iter().for_each(print_problem);
    if !r.lost_keys.is_empty() {
        println!("keys whose blocks are damaged:");
        r.lost_keys.iter().take(50).for_each(|(ns, k)| println!("  {ns}/{k}"));
        if r.lost_keys.len() > 50 {
            println!("  ... and {} more (--json lists all)", r.lost_keys.len() - 50);
        }
    }
}
