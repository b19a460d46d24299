//! `kvhoard ns`: show and set namespace policies (default codec, lossy allowed or not).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kvhoard_engine::{CodecSpec, Policy, StoreOptions};

use super::open;

/// What `ns` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum NsAction {
    /// List every namespace policy set on the volume.
    Show {
        /// Directory or block device.
        volume: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set a namespace's policy (unspecified parts keep their current value).
    Set {
        /// Directory or block device.
        volume: PathBuf,
        /// The namespace.
        namespace: String,
        /// Default codec for puts that name none (`raw` or `none`: store blocks as they are).
        #[arg(long, value_parser = crate::flags::parse_codec, value_name = "SPEC")]
        codec: Option<CodecSpec>,
        /// Whether lossy codecs (quant, drop-*) may be applied in the namespace.
        #[arg(long, value_parser = ["allow", "deny"], value_name = "allow|deny")]
        lossy: Option<String>,
    },
}

fn show_codec(p: &Policy) -> String {
    p.codec.map_or_else(|| "raw".to_string(), |c| c.to_string())
}

pub fn run(action: &NsAction, opts: StoreOptions) -> anyhow::Result<ExitCode> {
    match action {
        NsAction::Show { volume, json } => {
            let store = open(volume, opts)?;
            let policies = store.policies();
            store.close()?;
            if *json {
                let list: Vec<_> = policies
                    .iter()
                    .map(|(ns, p)| serde_json::json!({ "namespace": ns, "codec": show_codec(p), "lossy": p.lossy }))
                    .collect();
                println!("{}", serde_json::Value::Array(list));
            } else if policies.is_empty() {
                println!("no namespace policies: every namespace stores blocks as they are, lossy codecs denied");
            } else {
                println!("{:<24} {:<40} lossy", "namespace", "codec");
                for (ns, p) in &policies {
                    println!("{ns:<24} {:<40} {}", show_codec(p), if p.lossy { "allow" } else { "deny" });
                }
            }
        }
        NsAction::Set { volume, namespace, codec, lossy } => {
            let store = open(volume, opts)?;
            let current = store.policy(namespace);
            let policy = Policy {
                codec: match codec {
                    Some(c) if c.is_raw() => None,
                    Some(c) => Some(*c),
                    None => current.codec,
                },
                lossy: lossy.as_deref().map_or(current.lossy, |l| l == "allow"),
            };
            store.set_policy(namespace, policy).with_context(|| format!("cannot set the policy of {namespace:?}"))?;
            store.close()?;
            println!(
                "{namespace}: codec {}, lossy codecs {}",
                show_codec(&policy),
                if policy.lossy { "allowed" } else { "denied" }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
