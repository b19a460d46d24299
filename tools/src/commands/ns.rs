//! `kvhoard ns`: show and set namespace policies: the default codec, whether lossy codecs are
//! allowed, and the settings placement follows in the namespace (the planner's α, allowed codecs
//! and drift threshold; group TTL's budget, groups and window).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use kvhoard_engine::{CodecSpec, NsSettings, Policy, StoreError, StoreOptions, TtlSettings};
use kvhoard_serve::policy_json::{from_json, to_json};

use super::open;

/// A setting given on the command line: a value, or `default` to unset it.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting<T> {
    /// Back to the placement's own default.
    Default,
    /// This value.
    Set(T),
}

impl<T> Setting<T> {
    /// The setting's new value: given, unset (`default`), or `current` when not given.
    fn over(given: Option<Setting<T>>, current: Option<T>) -> Option<T> {
        match given {
            None => current,
            Some(Setting::Default) => None,
            Some(Setting::Set(v)) => Some(v),
        }
    }
}

fn setting<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Setting<T>, String> {
    if s == "default" {
        Ok(Setting::Default)
    } else {
        parse(s).map(Setting::Set)
    }
}

fn parse_alpha(s: &str) -> Result<Setting<f64>, String> {
    setting(s, |s| s.parse::<f64>().map_err(|e| format!("{s:?} is not seconds ({e}); e.g. 0.05")))
}

fn parse_drift(s: &str) -> Result<Setting<f64>, String> {
    setting(s, |s| {
        let pct = s.strip_suffix('%').unwrap_or(s);
        match pct.parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => Ok(p / 100.0),
            Ok(_) => Err(format!("{s:?} is not a percentage between 0% and 100%; e.g. 5%")),
            Err(e) => Err(format!("{s:?} is not a percentage ({e}); e.g. 5%")),
        }
    })
}

fn parse_codecs(s: &str) -> Result<Setting<Vec<CodecSpec>>, String> {
    setting(s, |s| {
        let codecs: Vec<CodecSpec> = s.split_whitespace().map(crate::flags::parse_codec).collect::<Result<_, _>>()?;
        if codecs.is_empty() {
            return Err("no codec listed; list `raw` to keep blocks only in the form they were put in".into());
        }
        Ok(codecs)
    })
}

fn parse_budget(s: &str) -> Result<Setting<u64>, String> {
    setting(s, crate::size::parse_size)
}

fn parse_count(s: &str) -> Result<Setting<u32>, String> {
    setting(s, |s| match s.parse::<u32>() {
        Ok(0) => Err("0 groups: give at least 1, or `default`".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?} is not a count ({e})")),
    })
}

fn parse_seconds(s: &str) -> Result<Setting<u32>, String> {
    setting(s, |s| {
        let (n, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
            Some((at, _)) => s.split_at(at),
            None => (s, "s"),
        };
        let n: u32 = n.parse().map_err(|e| format!("{s:?} is not a duration ({e}); e.g. 3600, 90m or 1h"))?;
        let scale = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            u if u.starts_with('.') => {
                return Err(format!("{s:?}: give a whole number of seconds, minutes or hours, e.g. 90m"))
            }
            _ => return Err(format!("{s:?}: a duration's unit is s, m or h")),
        };
        match n.checked_mul(scale) {
            Some(0) => Err("a window of 0 seconds learns from nothing: give at least 1s, or `default`".into()),
            Some(secs) => Ok(secs),
            None => Err(format!("{s:?} is too long")),
        }
    })
}

/// What `ns` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum NsAction {
    /// List every namespace policy set on the volume.
    Show {
        /// Directory or block device, or `http://ADDR`: a running server's metrics endpoint
        /// (`kvhoard serve --metrics ADDR`).
        volume: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set a namespace's policy (what is not given keeps its current value; `default` unsets a
    /// setting).
    Set {
        /// Directory or block device (not served), or `http://ADDR`: a running server's metrics
        /// endpoint (`kvhoard serve --metrics ADDR`), whose store applies the change at once and
        /// keeps it; asked from the server's own machine only.
        volume: PathBuf,
        /// The namespace.
        namespace: String,
        /// Default codec for puts that name none (`raw` or `none`: store blocks as they are).
        #[arg(long, value_parser = crate::flags::parse_codec, value_name = "SPEC")]
        codec: Option<CodecSpec>,
        /// Whether lossy codecs (quant, drop-*) may be applied in the namespace.
        #[arg(long, value_parser = ["allow", "deny"], value_name = "allow|deny")]
        lossy: Option<String>,
        /// The planner's α in the namespace: seconds of delay a block's whole quality is worth
        /// (higher keeps more quality; the planner's own default is 0.05).
        #[arg(long, value_parser = parse_alpha, value_name = "SECONDS|default")]
        alpha: Option<Setting<f64>>,
        /// The codecs the planner may store the namespace's blocks with, besides the form they
        /// were put in, separated by spaces and matched exactly against the planner's own
        /// (lossless, quant:bits=8, quant:bits=4, quant:bits=2), e.g. "lossless quant:bits=8";
        /// `raw`: none but the form as put; default: all of them. Lossy ones need `--lossy
        /// allow`.
        #[arg(long, value_parser = parse_codecs, value_name = "SPECS|default")]
        codecs: Option<Setting<Vec<CodecSpec>>>,
        /// How far a quality a client reports may fall below what the planner assumed before the
        /// context is scored again (e.g. 5%; default 5%).
        #[arg(long, value_parser = parse_drift, value_name = "PERCENT|default")]
        drift: Option<Setting<f64>>,
        /// Group TTL for blocks put without a TTL: the bytes its TTLs may keep stored on average
        /// (e.g. 40GiB); `default`: no group TTL.
        #[arg(long, value_parser = parse_budget, value_name = "BYTES|default")]
        ttl_budget: Option<Setting<u64>>,
        /// Group TTL: groups (prefix subtrees, by accesses) with a TTL of their own (default 64,
        /// at most 4096).
        #[arg(long, value_parser = parse_count, value_name = "N|default")]
        ttl_groups: Option<Setting<u32>>,
        /// Group TTL: how much access history the TTLs are learned from (e.g. 1h; default 1h).
        #[arg(long, value_parser = parse_seconds, value_name = "DURATION|default")]
        ttl_window: Option<Setting<u32>>,
    },
}

fn show_codec(p: &Policy) -> String {
    p.codec.map_or_else(|| "raw".to_string(), |c| c.to_string())
}

fn show_codecs(s: &NsSettings) -> Option<String> {
    s.codecs.as_deref().map(|c| c.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "))
}

/// The settings of `p` for people: only those set.
pub fn describe_settings(s: &NsSettings) -> String {
    let mut parts = Vec::new();
    if let Some(a) = s.alpha {
        parts.push(format!("alpha {a} s"));
    }
    if let Some(c) = show_codecs(s) {
        parts.push(format!("codecs \"{c}\""));
    }
    if let Some(d) = s.drift {
        parts.push(format!("drift {}%", d * 100.0));
    }
    if let Some(t) = s.ttl {
        let or_default = |v: u32, unit: &str| if v == 0 { "default".to_string() } else { format!("{v}{unit}") };
        parts.push(format!(
            "group TTL within {} (groups {}, window {})",
            crate::size::human(t.budget_bytes),
            or_default(t.groups, ""),
            or_default(t.window_s, " s")
        ));
    }
    parts.join(", ")
}

/// Where `ns` reads and sets policies: a volume it opens, or a running server's metrics
/// endpoint (`http://ADDR`), whose store applies a change at once.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    Volume(&'a Path),
    Server(&'a str),
}

impl Target<'_> {
    fn of(volume: &Path) -> Target<'_> {
        match volume.to_str().and_then(|v| v.strip_prefix("http://")) {
            Some(addr) => Target::Server(addr.trim_end_matches('/')),
            None => Target::Volume(volume),
        }
    }
}

/// The policies a running server's store has set, read from its metrics endpoint.
fn served_policies(addr: &str) -> anyhow::Result<Vec<(String, Policy)>> {
    let list = super::metrics_client::get_json(addr, "/ns")?;
    let list = list.as_array().with_context(|| format!("{addr}/ns is not a list of policies"))?;
    list.iter()
        .map(|v| match from_json(v) {
            Ok((Some(ns), policy)) => Ok((ns, policy)),
            Ok((None, _)) => anyhow::bail!("{addr}/ns lists a policy that names no namespace"),
            Err(why) => anyhow::bail!("{addr}/ns lists a policy this build cannot read: {why}"),
        })
        .collect()
}

pub fn run(action: NsAction, opts: StoreOptions) -> anyhow::Result<ExitCode> {
    match action {
        NsAction::Show { volume, json } => {
            let policies = match Target::of(&volume) {
                Target::Volume(path) => {
                    let store = open(path, opts)?;
                    let policies = store.policies();
                    store.close()?;
                    policies
                }
                Target::Server(addr) => served_policies(addr)?,
            };
            if json {
                let list: Vec<_> = policies.iter().map(|(ns, p)| to_json(ns, p)).collect();
                println!("{}", serde_json::Value::Array(list));
            } else if policies.is_empty() {
                println!("no namespace policies: every namespace stores blocks as they are, lossy codecs denied");
            } else {
                println!("{:<24} {:<32} {:<6} settings", "namespace", "codec", "lossy");
                for (ns, p) in &policies {
                    let lossy = if p.lossy { "allow" } else { "deny" };
                    println!("{ns:<24} {:<32} {lossy:<6} {}", show_codec(p), describe_settings(&p.settings));
                }
            }
        }
        NsAction::Set { volume, namespace, codec, lossy, alpha, codecs, drift, ttl_budget, ttl_groups, ttl_window } => {
            let target = Target::of(&volume);
            let store = match target {
                Target::Volume(path) => Some(open(path, opts).map_err(|e| {
                    let held = e.chain().any(|c| matches!(c.downcast_ref(), Some(StoreError::Locked { .. })));
                    match held {
                        true => e.context(
                            "a served volume's policies change through its server: \
                             kvhoard ns set http://METRICS_ADDR NAMESPACE ... \
                             (kvhoard serve --metrics METRICS_ADDR --allow-policy-changes)",
                        ),
                        false => e,
                    }
                })?),
                Target::Server(_) => None,
            };
            let current = match (&store, target) {
                (Some(store), _) => store.policy(&namespace),
                (None, Target::Server(addr)) => served_policies(addr)?
                    .into_iter()
                    .find(|(ns, _)| *ns == namespace)
                    .map_or_else(Policy::default, |(_, p)| p),
                (None, Target::Volume(_)) => Policy::default(),
            };
            let cur = current.settings.clone();
            let ttl = match Setting::over(ttl_budget, cur.ttl.map(|t| t.budget_bytes)) {
                None => {
                    if ttl_groups.is_some() || ttl_window.is_some() {
                        anyhow::bail!(
                            "group TTL needs a budget: give --ttl-budget BYTES with --ttl-groups or --ttl-window"
                        );
                    }
                    None
                }
                Some(budget_bytes) => Some(TtlSettings {
                    budget_bytes,
                    groups: Setting::over(ttl_groups, cur.ttl.map(|t| t.groups)).unwrap_or(0),
                    window_s: Setting::over(ttl_window, cur.ttl.map(|t| t.window_s)).unwrap_or(0),
                }),
            };
            let settings = NsSettings {
                alpha: Setting::over(alpha, cur.alpha),
                codecs: Setting::over(
                    codecs.map(|s| match s {
                        Setting::Default => Setting::Default,
                        Setting::Set(v) => Setting::Set(Arc::from(v)),
                    }),
                    cur.codecs,
                ),
                drift: Setting::over(drift, cur.drift),
                ttl,
            };
            let policy = Policy {
                codec: match codec {
                    Some(c) if c.is_raw() => None,
                    Some(c) => Some(c),
                    None => current.codec,
                },
                lossy: lossy.as_deref().map_or(current.lossy, |l| l == "allow"),
                settings,
            };
            match (store, target) {
                (Some(store), _) => {
                    store.set_policy(&namespace, policy.clone()).with_context(|| {
                        format!("cannot set the policy of {}", kvhoard_engine::format::quoted_short(&namespace))
                    })?;
                    store.close()?;
                }
                (None, Target::Server(addr)) => {
                    super::metrics_client::put_json(addr, "/ns", &to_json(&namespace, &policy)).with_context(|| {
                        format!(
                            "cannot set the policy of {} on the server at {addr}",
                            kvhoard_engine::format::quoted_short(&namespace)
                        )
                    })?;
                }
                (None, Target::Volume(_)) => {}
            }
            let settings = describe_settings(&policy.settings);
            println!(
                "{namespace}: codec {}, lossy codecs {}{}{settings}",
                show_codec(&policy),
                if policy.lossy { "allowed" } else { "denied" },
                if settings.is_empty() { "" } else { "; " },
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set<T: Clone>(r: Result<Setting<T>, String>) -> Option<T> {
        match r {
            Ok(Setting::Set(v)) => Some(v),
            _ => None,
        }
    }

    #[test]
    fn settings_out_of_range_are_refused_with_their_reason() {
        assert_eq!(set(parse_drift("5%")), Some(0.05));
        assert!(parse_drift("500%").is_err_and(|e| e.contains("between 0% and 100%")));
        assert!(parse_drift("-1").is_err());
        assert_eq!(set(parse_count("64")), Some(64));
        assert!(parse_count("0").is_err_and(|e| e.contains("at least 1")));
        assert!(matches!(parse_count("default"), Ok(Setting::Default)));
        assert_eq!(set(parse_seconds("90m")), Some(5400));
        assert!(parse_seconds("0").is_err_and(|e| e.contains("at least 1s")));
        assert!(parse_seconds("1.5h").is_err_and(|e| e.contains("whole number")));
        assert!(parse_seconds("2d").is_err_and(|e| e.contains("s, m or h")));
    }
}
