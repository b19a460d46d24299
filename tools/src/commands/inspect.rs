//! `kvhoard inspect`: what a volume holds, read through its on-disk format.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvhoard_engine::check::inspect::{kind_name, VolumeView};
use kvhoard_engine::check::scan::{HeaderState, SummaryState};
use kvhoard_engine::format::CompressionMeta;
use kvhoard_engine::Clock;
use kvhoard_engine::Loc;
use serde_json::json;

use super::hex;
use crate::cli::InspectWhat;
use crate::size::human;
use crate::EXIT_NOT_FOUND;

pub fn run(volume: &Path, what: Option<InspectWhat>, namespace: &str, json: bool) -> anyhow::Result<ExitCode> {
    let view = VolumeView::open(volume).with_context(|| format!("cannot inspect {}", volume.display()))?;
    if let Some(have) = view.cut_short() {
        eprintln!(
            "kvhoard: warning: the volume file is cut short ({have} bytes of {}): the segments past its end are missing from this view, and the engine refuses to open the volume; `kvhoard fsck --repair {}` extends it",
            view.scan.sb.capacity_bytes,
            volume.display()
        );
    }
    match what.unwrap_or(InspectWhat::Summary) {
        InspectWhat::Summary => summary(&view, json),
        InspectWhat::Segments => segments(&view, json),
        InspectWhat::Segment { index } => segment(&view, index, json)?,
        InspectWhat::Block { key } => return block(&view, namespace, &key, json),
        InspectWhat::Dump { key, raw } => return dump(&view, namespace, &key, raw),
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(view: &VolumeView, json: bool) {
    let s = view.summary(Clock::system().now_unix_s());
    if json {
        let ns: serde_json::Map<String, serde_json::Value> = s
            .namespaces
            .iter()
            .map(|(n, (k, b, l, u))| {
                (n.clone(), json!({ "keys": k, "blocks": b, "logical_bytes": l, "unique_bytes": u }))
            })
            .collect();
        println!(
            "{}",
            json!({
                "capacity_bytes": s.capacity_bytes, "used_bytes": s.used_bytes, "free_bytes": s.free_bytes,
                "segments": s.segments, "segments_free": s.segments_free, "segments_open": s.segments_open, "segments_sealed": s.segments_sealed,
                "keys": s.keys, "blocks": s.blocks, "logical_bytes": s.logical_bytes, "unique_bytes": s.unique_bytes,
                "dedup_saved_bytes": s.logical_bytes.saturating_sub(s.unique_bytes),
                "namespaces": ns, "codecs": s.codecs, "tiers": s.tiers,
                "live_ratio_histogram": s.live_ratio_histogram, "ttl": s.ttl, "age": s.age,
                "checkpoint_seq": view.checkpoint_seq,
                "file_cut_short_at_bytes": view.cut_short(),
                "freed_ahead_seq": view.scan.sb.freed_ahead.seq,
                "freed_ahead_checkpoint_seq": view.scan.sb.freed_ahead.checkpoint_seq,
            })
        );
        return;
    }
    println!(
        "capacity   {} ({} segments: {} free, {} open, {} sealed)",
        human(s.capacity_bytes),
        s.segments,
        s.segments_free,
        s.segments_open,
        s.segments_sealed
    );
    println!("used       {}   free {}", human(s.used_bytes), human(s.free_bytes));
    println!("keys       {} naming {} blocks", s.keys, s.blocks);
    println!(
        "dedup      {} stored by clients, {} kept ({} saved)",
        human(s.logical_bytes),
        human(s.unique_bytes),
        human(s.logical_bytes.saturating_sub(s.unique_bytes))
    );
    for (n, (k, b, l, u)) in &s.namespaces {
        println!("namespace  {n:<24} {k:>9} keys {b:>9} blocks {:>10} logical {:>10} unique", human(*l), human(*u));
    }
    println!("codecs     {}", join(&s.codecs));
    println!("tiers      {}", join(&s.tiers));
    println!("live ratio of segments in use:");
    for (i, n) in s.live_ratio_histogram.iter().enumerate() {
        println!("  {:>3}-{:>3}%  {:>6}  {}", i * 10, i * 10 + 10, n, "#".repeat((*n as usize).min(60)));
    }
    println!("ttl        {}", join(&s.ttl));
    println!("age        {}", join(&s.age));
    let freed = view.scan.sb.freed_ahead;
    println!(
        "checkpoint {}   {}",
        view.checkpoint_seq.map_or_else(|| "none usable".to_string(), |c| format!("#{c}")),
        if freed.seq == 0 {
            "no segment freed ahead of an older one".to_string()
        } else {
            format!(
                "segment uses up to {} freed ahead of older ones: without checkpoint #{} or newer, open voids the keys written before",
                freed.seq, freed.checkpoint_seq
            )
        }
    );
}

fn join(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
}

fn state(h: &HeaderState, s: &SummaryState) -> &'static str {
    match (h, s) {
        (HeaderState::Free, _) => "free",
        (HeaderState::Damaged(_), _) => "damaged",
        (_, SummaryState::Sealed) => "sealed",
        (_, SummaryState::Unsealed) => "open",
        (_, SummaryState::Damaged(_)) => "sealed (summary damaged)",
    }
}

fn segments(view: &VolumeView, json: bool) {
    let live = view.live_units();
    let units = view.scan.sb.segment_units();
    let now_ms = Clock::system().now_unix_ms();
    if !json {
        println!("{:>7}  {:<10} {:>10} {:>8} {:>7}  {:>10}", "segment", "state", "seq", "records", "live", "age");
    }
    for seg in &view.scan.segments {
        let ratio = live.get(&seg.index).copied().unwrap_or(0) as f64 / f64::from(units);
        let (seq, created) = match seg.header {
            HeaderState::InUse { seq, created_unix_ms } => (Some(seq), Some(created_unix_ms)),
            _ => (None, None),
        };
        let age_s = created.map(|c| now_ms.saturating_sub(c) / 1000);
        if json {
            println!(
                "{}",
                json!({ "segment": seg.index, "state": state(&seg.header, &seg.summary), "seq": seq, "records": seg.records.len(),
                        "live_ratio": (ratio * 1000.0).round() / 1000.0, "end_unit": seg.end_unit, "age_secs": age_s })
            );
        } else {
            println!(
                "{:>7}  {:<10} {:>10} {:>8} {:>6.1}%  {:>10}",
                seg.index,
                state(&seg.header, &seg.summary),
                seq.map_or("-".into(), |s| s.to_string()),
                seg.records.len(),
                ratio * 100.0,
                age_s.map_or("-".into(), |a| format!("{a} s"))
            );
        }
    }
}

fn segment(view: &VolumeView, index: u32, json: bool) -> anyhow::Result<()> {
    let Some(seg) = view.scan.segments.get(index as usize) else {
        anyhow::bail!(
            "no segment {index}: the volume has {} (0 to {})",
            view.scan.segments.len(),
            view.scan.segments.len().saturating_sub(1)
        );
    };
    if !json {
        println!("segment {index}: {}, {} records", state(&seg.header, &seg.summary), seg.records.len());
        println!("{:>6}  {:<9} {:>10} {:>10}  {:<5} namespace/key", "unit", "kind", "raw", "stored", "live");
    }
    for rec in &seg.records {
        let h = &rec.header;
        let loc = Loc { segment: index, unit: rec.unit };
        let live = view.is_current(loc);
        if json {
            println!(
                "{}",
                json!({ "unit": rec.unit, "offset": view.offset(loc), "kind": kind_name(h.kind), "namespace": h.namespace, "key": h.key,
                        "raw_len": h.raw_len, "stored_len": h.stored_len, "created_unix_ms": h.created_unix_ms, "ttl_secs": h.ttl_secs,
                        "content_hash": hex(&h.content_hash), "live": live })
            );
        } else {
            println!(
                "{:>6}  {:<9} {:>10} {:>10}  {:<5} {}/{}",
                rec.unit,
                kind_name(h.kind),
                h.raw_len,
                h.stored_len,
                if live { "yes" } else { "no" },
                h.namespace,
                h.key
            );
        }
    }
    Ok(())
}

fn block(view: &VolumeView, namespace: &str, key: &str, json: bool) -> anyhow::Result<ExitCode> {
    let Some(found) = view.find(namespace, key) else {
        eprintln!("kvhoard: no key or content hash {key:?} in namespace {namespace:?}");
        return Ok(ExitCode::from(EXIT_NOT_FOUND));
    };
    let h = view.header(found.block).context("the block's record is not in any segment summary")?.clone();
    let (_, _, computed) = view.read_record(found.block)?;
    let keys_naming = view.references(found.block);
    let out = json!({
        "namespace": h.namespace,
        "key": found.key,
        "written_by_key": h.key,
        "kind": kind_name(h.kind),
        "content_hash": hex(&h.content_hash),
        "raw_len": h.raw_len,
        "stored_len": h.stored_len,
        "size": h.raw_len,
        "stored_bytes": h.stored_len,
        "dtype": h.desc.dtype.name(),
        "layout": h.desc.layout.name(),
        "shape": h.desc.shape,
        "codec": kvhoard_engine::codec_name(&h.desc, h.raw_len, &h.compression),
        "codec_id": CompressionMeta::codec_name(h.compression.codec_id),
        "codec_version": h.compression.codec_version,
        "codec_params": hex(&h.compression.params),
        "created_unix_ms": h.created_unix_ms,
        "ttl_secs": h.ttl_secs,
        "expires_unix_s": found.expires_unix_s,
        "group_id": h.group_id,
        "parent_hash": h.parent_hash.map(|p| hex(&p)),
        "segment": found.block.segment,
        "unit": found.block.unit,
        "offset": view.offset(found.block),
        "record_bytes": h.record_bytes(),
        "segment_seq": h.segment_seq,
        "payload_crc32c": format!("{:#010x}", h.payload_crc),
        "payload_crc32c_computed": format!("{computed:#010x}"),
        "payload_intact": computed == h.payload_crc,
        "keys_naming_it": keys_naming,
        "key_record": found.key_record.map(|l| json!({ "segment": l.segment, "unit": l.unit, "offset": view.offset(l) })),
    });
    if json {
        println!("{out}");
    } else if let Some(obj) = out.as_object() {
        obj.iter().for_each(|(k, v)| println!("{k:<24} {v}"));
    }
    Ok(ExitCode::SUCCESS)
}

fn dump(view: &VolumeView, namespace: &str, key: &str, raw: bool) -> anyhow::Result<ExitCode> {
    let Some(found) = view.find(namespace, key) else {
        eprintln!("kvhoard: no key or content hash {key:?} in namespace {namespace:?}");
        return Ok(ExitCode::from(EXIT_NOT_FOUND));
    };
    let (buf, range, _) = view.read_record(found.block)?;
    let bytes = buf.get(range).unwrap_or_default();
    let mut out = std::io::stdout().lock();
    if raw {
        out.write_all(bytes)?;
    } else {
        for (i, line) in bytes.chunks(16).enumerate() {
            let hexes: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
            let text: String =
                line.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
            writeln!(out, "{:08x}  {:<47}  |{text}|", i * 16, hexes.join(" "))?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
