//! The statistics in the Prometheus text exposition format (version 0.0.4).

use std::fmt::Write as _;

use super::Stats;

impl Stats {
    /// The statistics as Prometheus metrics: gauges for state, `_total` counters for what
    /// happened since the store was opened, and per-tier series labelled `tier`.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP kvhoard_{name} {help}\n# TYPE kvhoard_{name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "kvhoard_{name}{labels} {value}");
            }
        };
        let one = |v: u64| [(String::new(), v as f64)];
        for (name, help, v) in [
            ("capacity_bytes", "Bytes of the volume's segments.", self.capacity_bytes),
            ("used_bytes", "Bytes of the log in use.", self.used_bytes),
            ("live_bytes", "Bytes of records still named by a key.", self.live_bytes),
            ("keys", "Live keys.", self.keys),
            ("blocks", "Distinct stored blocks.", self.blocks),
            ("logical_bytes", "Sum of the sizes of the keys' blocks.", self.logical_bytes),
            ("unique_bytes", "Raw bytes of the distinct blocks.", self.unique_bytes),
            ("index_memory_bytes", "Memory of the in-memory index.", self.index_memory_bytes),
            (
                "checkpoint_memory_bytes",
                "Memory kept from the last checkpoint for the next one's snapshot.",
                self.checkpoint_memory_bytes,
            ),
            (
                "checkpoint_snapshot_us",
                "Microseconds the last checkpoint's snapshot held every put waiting.",
                self.checkpoint_snapshot_us,
            ),
            ("placement_contexts", "Contexts the placement planner knows.", self.placement.contexts),
            ("placement_planned_bytes", "Bytes the placement planner counts as kept.", self.placement.planned_bytes),
            ("placement_budget_bytes", "Bytes the placement planner keeps them within.", self.placement.budget_bytes),
            ("segments_free", "Segments free for writing.", u64::from(self.segments_free)),
            ("pinned_keys", "Keys pinned against reclaim.", self.pinned_keys),
            (
                "writes_refused",
                "1 if writes are refused after a failed write or sync.",
                u64::from(self.poisoned.is_some()),
            ),
        ] {
            metric(name, "gauge", help, &one(v));
        }
        metric(
            "write_amplification",
            "gauge",
            "Bytes written by cleaning divided by bytes put.",
            &[(String::new(), self.write_amplification)],
        );
        let per_codec = |f: fn(&super::CodecStats) -> u64| -> Vec<(String, f64)> {
            self.codecs.iter().map(|c| (format!("{{codec=\"{}\"}}", c.codec), f(c) as f64)).collect()
        };
        metric("codec_blocks", "gauge", "Distinct blocks per kind of codec.", &per_codec(|c| c.blocks));
        metric(
            "codec_logical_bytes",
            "gauge",
            "Original bytes of the blocks per kind of codec.",
            &per_codec(|c| c.logical_bytes),
        );
        metric(
            "codec_stored_bytes",
            "gauge",
            "Bytes the blocks' records occupy per kind of codec.",
            &per_codec(|c| c.stored_bytes),
        );
        let per_ns = |f: fn(&super::NamespaceStats) -> u64| -> Vec<(String, f64)> {
            self.namespaces.iter().map(|n| (format!("{{namespace=\"{}\"}}", label(&n.name)), f(n) as f64)).collect()
        };
        metric(
            "namespace_unique_bytes",
            "gauge",
            "Original bytes of a namespace's distinct blocks.",
            &per_ns(|n| n.unique_bytes),
        );
        metric("namespace_stored_bytes", "gauge", "Bytes a namespace's records occupy.", &per_ns(|n| n.stored_bytes));
        for (name, help, v) in [
            ("compressed_total", "Blocks the store compressed on put.", self.compressed),
            ("codec_skipped_total", "Blocks a codec could not take, stored as they were.", self.codec_skipped),
            ("decoded_total", "Blocks decoded on reads.", self.decoded),
            ("segments_cleaned_total", "Segments the cleaner emptied ahead of need.", self.segments_cleaned),
            (
                "segments_freed_ahead_total",
                "Segments freed while an older one was still in the log (recorded in the superblock).",
                self.segments_freed_ahead,
            ),
            ("relocated_records_total", "Records the cleaner wrote again.", self.relocated_records),
            ("relocated_bytes_total", "Bytes the cleaner wrote.", self.relocated_bytes),
            (
                "recompressed_records_total",
                "Blocks the cleaner wrote in another codec's form.",
                self.recompressed_records,
            ),
            (
                "recompressed_saved_bytes_total",
                "Bytes recompressed records take less than the ones they replaced.",
                self.recompressed_saved_bytes,
            ),
            (
                "quality_samples_total",
                "Blocks recoded to a lossy form whose quality was estimated and told to placement.",
                self.quality_samples,
            ),
            (
                "quality_rescored_total",
                "Quality samples after which placement scored the block's context again.",
                self.quality_rescored,
            ),
            ("puts_total", "Blocks put (including deduplicated ones).", self.puts),
            ("put_bytes_total", "Bytes written for puts.", self.put_bytes),
            ("dedup_hits_total", "Puts whose bytes were already stored.", self.dedup_hits),
            ("gets_total", "Gets.", self.gets),
            ("get_hits_total", "Gets that returned a block.", self.hits),
            ("get_misses_total", "Gets that found nothing.", self.misses),
            ("get_bytes_total", "Bytes returned by gets.", self.get_bytes),
            ("read_errors_total", "Blocks found damaged on read (served as misses).", self.read_errors),
            ("direct_reads_total", "Reads into the caller's buffer with no engine buffer or copy.", self.direct_reads),
            ("deletes_total", "Keys deleted.", self.deletes),
            ("evicted_keys_total", "Keys dropped by segment reclaim.", self.evicted_keys),
            ("evicted_bytes_total", "Bytes dropped by segment reclaim.", self.evicted_bytes),
            ("segments_reclaimed_total", "Segments reclaimed.", self.segments_reclaimed),
            (
                "planner_dropped_keys_total",
                "Keys of contexts the placement planner dropped, removed at once.",
                self.planner_dropped_keys,
            ),
            (
                "pins_overridden_total",
                "Segments reclaimed although they held a pinned key (every sealed segment did).",
                self.pins_overridden,
            ),
            ("checkpoints_total", "Checkpoints written.", self.checkpoints),
            ("checkpoint_errors_total", "Checkpoints that could not be written.", self.checkpoint_errors),
            ("syncs_total", "fdatasync calls.", self.syncs),
        ] {
            metric(name, "counter", help, &one(v));
        }
        let per_tier = |f: &dyn Fn(&crate::tier::TierStats) -> f64| -> Vec<(String, f64)> {
            self.tiers.iter().map(|t| (format!("{{tier=\"{}\"}}", t.tier), f(t))).collect()
        };
        for (name, kind, help, f) in [
            (
                "tier_capacity_bytes",
                "gauge",
                "Bytes the tier may hold.",
                &(|t: &crate::tier::TierStats| t.capacity_bytes) as &dyn Fn(&crate::tier::TierStats) -> u64,
            ),
            ("tier_resident_bytes", "gauge", "Bytes the tier holds.", &|t| t.resident_bytes),
            ("tier_entries", "gauge", "Blocks the tier holds.", &|t| t.entries),
            ("tier_hits_total", "counter", "Loads served by the tier.", &|t| t.hits),
            ("tier_misses_total", "counter", "Loads that reached the tier and were not served by it.", &|t| t.misses),
            ("tier_hit_bytes_total", "counter", "Bytes served by the tier.", &|t| t.hit_bytes),
            ("tier_admitted_total", "counter", "Blocks admitted to the tier.", &|t| t.admitted),
            ("tier_rejected_total", "counter", "Blocks the tier turned away.", &|t| t.rejected),
            ("tier_evictions_total", "counter", "Blocks evicted from the tier.", &|t| t.evictions),
        ] {
            metric(name, kind, help, &per_tier(&|t| f(t) as f64));
        }
        let mut latency = Vec::new();
        for t in &self.tiers {
            let l = &t.load_latency;
            for (q, v) in [("0.5", l.p50_ns), ("0.9", l.p90_ns), ("0.99", l.p99_ns), ("0.999", l.p999_ns)] {
                latency.push((format!("{{tier=\"{}\",quantile=\"{q}\"}}", t.tier), v as f64 / 1e9));
            }
        }
        metric("tier_load_latency_seconds", "summary", "Latency of the loads a tier served.", &latency);
        for t in &self.tiers {
            let l = &t.load_latency;
            let _ = writeln!(
                out,
                "kvhoard_tier_load_latency_seconds_sum{{tier=\"{}\"}} {}",
                t.tier,
                (l.mean_ns as f64 * l.count as f64) / 1e9
            );
            let _ = writeln!(out, "kvhoard_tier_load_latency_seconds_count{{tier=\"{}\"}} {}", t.tier, l.count);
        }
        out
    }
}

/// A label value escaped as the exposition format asks (backslash, quote, newline).
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
