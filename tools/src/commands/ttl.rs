//! `kvhoard ttl ADDR`: what group TTL decides in a running server's namespaces (those set with
//! `kvhoard ns set VOLUME NS --ttl-budget BYTES`), read from its metrics endpoint (`GET /ttl`).
//! Group TTL learns from the traffic the server sees, so it lives in the server, not the volume.

use std::process::ExitCode;

use serde_json::Value;

use super::metrics_client::show;

/// `kvhoard ttl`.
#[derive(Debug, Clone, clap::Args)]
pub struct TtlArgs {
    /// The server's metrics address (its --metrics): PORT (on 127.0.0.1), HOST:PORT or
    /// [IPv6]:PORT.
    pub addr: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &TtlArgs) -> anyhow::Result<ExitCode> {
    show(&args.addr, "/ttl", args.json, render)?;
    Ok(ExitCode::SUCCESS)
}

fn ttl_text(ttl: &Value) -> String {
    match ttl.as_u64() {
        None => "none".into(),
        Some(0) => "not kept".into(),
        Some(ms) => format!("{:.0} s", (ms as f64 / 1e3).ceil()),
    }
}

/// The view for people: per namespace, its budget and plan, then its groups.
fn render(view: &Value) -> String {
    let namespaces = view.as_array().map_or(&[][..], Vec::as_slice);
    if namespaces.is_empty() {
        return "no namespace keeps group TTL; set one with `kvhoard ns set VOLUME NS --ttl-budget BYTES`\n".into();
    }
    let mut out = String::new();
    for ns in namespaces {
        out.push_str(&format!(
            "namespace {}: budget {} on average, {} groups at most, window {} s\n",
            ns["namespace"].as_str().unwrap_or("?"),
            crate::size::human(ns["budget_bytes"].as_u64().unwrap_or(0)),
            ns["groups_max"],
            ns["window_s"],
        ));
        out.push_str(&format!(
            "  {} accesses in the window, {} plans made, {} puts given a TTL\n",
            ns["accesses"], ns["plans"], ns["ttls_given"]
        ));
        match ns["expected_hits"].as_u64() {
            None => out.push_str("  no plan yet: blocks are put without a TTL until the first one\n"),
            Some(hits) => out.push_str(&format!(
                "  the plan expects {hits} hits over the window; the best single TTL ({}) {}\n",
                ttl_text(&ns["single_ttl_ms"]),
                ns["single_hits"].as_u64().map_or_else(|| "-".into(), |h| h.to_string()),
            )),
        }
        out.push_str(&format!("  {:<18} {:>10} {:>10} {:>8}\n", "group", "TTL", "accesses", "hits"));
        for g in ns["groups"].as_array().into_iter().flatten() {
            let group = g["group"].as_u64().map_or_else(|| "(every other)".to_string(), |g| format!("{g:016x}"));
            out.push_str(&format!(
                "  {group:<18} {:>10} {:>10} {:>8}\n",
                ttl_text(&g["ttl_ms"]),
                g["accesses"].as_u64().unwrap_or(0),
                g["hits"].as_u64().map_or_else(|| "-".into(), |h| h.to_string()),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn namespaces_and_groups_are_rendered() {
        let view = serde_json::json!([{
            "namespace": "lmcache", "budget_bytes": 1073741824u64, "groups_max": 64, "window_s": 3600,
            "accesses": 1200, "plans": 3, "ttls_given": 400, "expected_hits": 700,
            "single_ttl_ms": 30000, "single_hits": 600,
            "groups": [
                {"group": 255, "ttl_ms": 120000, "accesses": 800, "hits": 650},
                {"group": null, "ttl_ms": 0, "accesses": 400, "hits": 0}
            ]
        }]);
        let text = render(&view);
        assert!(text.contains("namespace lmcache: budget 1.0 GiB on average"), "{text}");
        assert!(text.contains("best single TTL (30 s) 600"), "{text}");
        assert!(text.contains("00000000000000ff        120 s        800      650"), "{text}");
        assert!(text.contains("(every other)        not kept        400        0"), "{text}");
        assert!(render(&serde_json::json!([])).contains("no namespace keeps group TTL"));
    }
}
