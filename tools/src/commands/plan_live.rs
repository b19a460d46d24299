//! `kvhoard plan live ADDR`: what a running server's placement planner decides, read from its
//! metrics endpoint (`GET /plan`, `kvhoard serve --metrics ADDR --placement planner`).

use std::process::ExitCode;

use serde_json::Value;

use super::metrics_client::show;

/// `kvhoard plan live`.
#[derive(Debug, Clone, clap::Args)]
pub struct LiveArgs {
    /// The server's metrics address (its --metrics): PORT (on 127.0.0.1), HOST:PORT or
    /// [IPv6]:PORT.
    pub addr: String,
    /// Contexts and steps to list.
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub limit: usize,
    /// Print the planner's view as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &LiveArgs) -> anyhow::Result<ExitCode> {
    show(&args.addr, &format!("/plan?limit={}", args.limit), args.json, render)?;
    Ok(ExitCode::SUCCESS)
}

/// The view for people: the options, the totals, the contexts used most and the next steps.
fn render(view: &Value) -> String {
    let options: Vec<&str> = view["options"]
        .as_array()
        .map_or(Vec::new(), |o| o.iter().map(|o| o["name"].as_str().unwrap_or("?")).collect());
    let name = |k: &Value| k.as_u64().and_then(|k| options.get(k as usize).copied()).unwrap_or("?");
    let report = &view["report"];
    let human = |v: &Value| crate::size::human(v.as_u64().unwrap_or(0));
    let mut out = format!(
        "planner: {} contexts, {} of {} budget kept, {:.3} s of CPU deciding\n\
         reuse: half-life {:.0} s (the median gap between a context's uses); {} contexts dropped by cleaning\n",
        report["contexts"],
        human(&report["planned_bytes"]),
        human(&report["budget_bytes"]),
        report["cpu_s"].as_f64().unwrap_or(0.0),
        report["half_life_ms"].as_f64().unwrap_or(0.0) / 1e3,
        report["cleaning_drops"].as_u64().unwrap_or(0),
    );
    if report["dram_budget_bytes"].as_u64().unwrap_or(0) > 0 {
        out.push_str(&format!(
            "DRAM tier: {} of {} budget held in memory\n",
            human(&report["dram_planned_bytes"]),
            human(&report["dram_budget_bytes"])
        ));
    }
    out.push_str("\noptions:\n");
    for o in view["options"].as_array().into_iter().flatten() {
        let held = o["dram_delay_s"].as_f64().map_or_else(String::new, |d| format!(", {:.1} ms in memory", d * 1e3));
        out.push_str(&format!(
            "  {:<16} ratio {:.3}  delay {:.1} ms{held}\n",
            o["name"].as_str().unwrap_or("?"),
            o["ratio"].as_f64().unwrap_or(0.0),
            o["delay_s"].as_f64().unwrap_or(0.0) * 1e3
        ));
    }
    out.push_str("\ncontexts used most (the next cleaning keeps each as its option says):\n");
    out.push_str(&format!(
        "  {:<16} {:>7} {:>10} {:>9}  {:<16} {:>12}\n",
        "context", "blocks", "block", "freq", "option", "utility"
    ));
    for c in view["contexts"].as_array().into_iter().flatten() {
        let option = c["option"].as_u64().unwrap_or(0) as usize;
        out.push_str(&format!(
            "  {:016x} {:>7} {:>10} {:>9.3}  {:<16} {:>12}\n",
            c["context"].as_u64().unwrap_or(0),
            c["blocks"].as_u64().unwrap_or(0),
            crate::size::human(c["block_bytes"].as_u64().unwrap_or(0)),
            c["freq"].as_f64().unwrap_or(0.0),
            format!("{}{}", name(&c["option"]), if c["dram"].as_bool() == Some(true) { " +dram" } else { "" }),
            // An option closed to the context (-inf) comes as null.
            c["utility"].get(option).and_then(Value::as_f64).map_or_else(|| "-".to_string(), |u| format!("{u:.4}")),
        ));
    }
    out.push_str("\nnext steps if over budget (cheapest first):\n");
    for s in view["next_steps"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {:016x} {} -> {}: frees {}{}, loses {:.3e} per byte\n",
            s["context"].as_u64().unwrap_or(0),
            name(&s["from"]),
            name(&s["to"]),
            human(&s["bytes_freed"]),
            if s["from_dram"].as_bool() == Some(true) { " of memory" } else { "" },
            s["loss_per_byte"].as_f64().unwrap_or(0.0),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render;

    #[test]
    fn a_view_is_rendered_with_option_names() {
        let view = serde_json::json!({
            "options": [
                {"name": "as put", "ratio": 1.0, "delay_s": 0.011},
                {"name": "quant:bits=8", "ratio": 0.53, "delay_s": 0.006},
                {"name": "dropped", "ratio": 0.0, "delay_s": 0.017}
            ],
            "report": {"policy": "planner", "contexts": 2, "planned_bytes": 3145728, "budget_bytes": 4194304,
                       "dram_planned_bytes": 1048576, "dram_budget_bytes": 2097152, "cpu_s": 0.002,
                       "half_life_ms": 123000, "cleaning_drops": 7},
            "contexts": [{"context": 255, "blocks": 3, "block_bytes": 1048576, "option": 1, "dram": true, "freq": 2.0,
                          "quality": [1.0, 0.99, 1.0], "utility": [0.1, 0.09, 0.05]}],
            "next_steps": [{"context": 255, "from": 1, "to": 2, "from_dram": false, "loss_per_byte": 1e-9, "bytes_freed": 1572864},
                           {"context": 255, "from": 1, "to": 1, "from_dram": true, "loss_per_byte": 2e-9, "bytes_freed": 1572864}]
        });
        let text = render(&view);
        assert!(text.contains("planner: 2 contexts, 3.0 MiB of 4.0 MiB budget kept"), "{text}");
        assert!(
            text.contains(
                "reuse: half-life 123 s (the median gap between a context's uses); 7 contexts dropped by cleaning"
            ),
            "{text}"
        );
        assert!(text.contains("DRAM tier: 1.0 MiB of 2.0 MiB budget held in memory"), "{text}");
        assert!(text.contains("00000000000000ff       3    1.0 MiB     2.000  quant:bits=8 +dram"), "{text}");
        assert!(text.contains("quant:bits=8 -> dropped: frees 1.5 MiB, loses"), "{text}");
        assert!(text.contains("quant:bits=8 -> quant:bits=8: frees 1.5 MiB of memory"), "{text}");
    }
}
