//! `kvhoard trace generate` and `kvhoard trace stats`: traces in Mooncake's format with a reuse
//! structure chosen on purpose, and the numbers that tell one trace's reuse from another's.
//!
//! Two shapes, both deterministic in their seed:
//!
//! - `sessions`: multi-turn conversations, like the shared Mooncake trace. Sessions start at
//!   Poisson arrivals; each turn's prompt is the previous turn's prompt and answer plus a new
//!   message, so a session reuses its own growing prefix, and a few system prompts are shared by
//!   every session.
//! - `documents`: questions about documents (retrieval-augmented or tool-heavy traffic). Each
//!   request is one whole document (4 to 64 blocks) followed by a question of its own; documents
//!   are chosen by a Zipf law, so a small hot set is read again and again by unrelated requests,
//!   and the long tail is read once.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use kvhoard_kernels::rng::Rng;
use serde_json::json;

use super::trace::{Trace, BLOCK_TOKENS};

/// The reuse structure of a generated trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Multi-turn conversations sharing a few system prompts.
    Sessions,
    /// Whole documents chosen by a Zipf law, each with a question of its own.
    Documents,
}

/// The flags of `trace generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// The reuse structure.
    #[arg(long, value_enum, default_value = "documents")]
    pub shape: Shape,
    /// Requests to generate.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub requests: usize,
    /// Mean arrivals per second (Poisson).
    #[arg(long, default_value_t = 1.0, value_name = "RATE")]
    pub rate: f64,
    /// Documents the `documents` shape draws from [default: requests / 4].
    #[arg(long, value_name = "N")]
    pub documents: Option<usize>,
    /// Zipf exponent of document popularity (0: uniform; about 1: a small hot set).
    #[arg(long, default_value_t = 0.9, value_name = "S")]
    pub zipf: f64,
    /// Seed: the same seed and flags give the same trace, byte for byte.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the trace into FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// One generated request line.
struct Line {
    timestamp_ms: u64,
    input_tokens: u64,
    output_tokens: u64,
    blocks: Vec<u64>,
}

/// Fresh block ids, never shared by accident.
struct Ids(u64);

impl Ids {
    fn take(&mut self, n: usize) -> Vec<u64> {
        let first = self.0;
        self.0 += n as u64;
        (first..self.0).collect()
    }
}

/// An exponential wait of mean `1 / rate` seconds, in ms.
fn wait_ms(rng: &mut Rng, rate: f64) -> f64 {
    let u = (f64::from(rng.uniform()) + 1e-9).min(1.0);
    -u.ln() / rate * 1000.0
}

/// Tokens for `blocks` full blocks and a partial last one of 1..=512 tokens.
fn tokens(rng: &mut Rng, blocks: usize) -> u64 {
    (blocks as u64 - 1) * BLOCK_TOKENS + 1 + rng.below(BLOCK_TOKENS)
}

fn documents(args: &GenerateArgs, rng: &mut Rng) -> Vec<Line> {
    let count = args.documents.unwrap_or(args.requests / 4).max(1);
    let mut ids = Ids(0);
    let docs: Vec<Vec<u64>> = (0..count).map(|_| ids.take(4 + rng.below(61) as usize)).collect();
    // Popularity: weight 1 / rank^s, sampled through its cumulative sum.
    let mut cumulative = Vec::with_capacity(count);
    let mut total = 0.0;
    for rank in 1..=count {
        total += 1.0 / (rank as f64).powf(args.zipf);
        cumulative.push(total);
    }
    let mut now = 0.0;
    (0..args.requests)
        .map(|_| {
            now += wait_ms(rng, args.rate);
            let target = f64::from(rng.uniform()) * total;
            let doc = cumulative.partition_point(|&c| c <= target).min(count - 1);
            let mut blocks = docs[doc].clone();
            blocks.extend(ids.take(1 + rng.below(2) as usize));
            Line {
                timestamp_ms: now as u64,
                input_tokens: tokens(rng, blocks.len()),
                output_tokens: 50 + rng.below(400),
                blocks,
            }
        })
        .collect()
}

fn sessions(args: &GenerateArgs, rng: &mut Rng) -> Vec<Line> {
    let mut ids = Ids(0);
    let systems: Vec<Vec<u64>> = (0..4).map(|_| ids.take(2 + rng.below(4) as usize)).collect();
    // (next turn's time, prompt so far) per open session; a session opens at each arrival of the
    // session process and lives 2 to 12 turns, a minute or so apart.
    let mut lines = Vec::with_capacity(args.requests);
    let mut open: Vec<(f64, Vec<u64>, u32)> = Vec::new();
    let mut next_session = 0.0;
    let session_rate = args.rate / 5.0;
    while lines.len() < args.requests {
        let due = open.iter().enumerate().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(i, s)| (i, s.0));
        let (now, index) = match due {
            Some((i, t)) if t < next_session => (t, i),
            _ => {
                let system = systems[rng.below(systems.len() as u64) as usize].clone();
                open.push((next_session, system, 2 + rng.below(11) as u32));
                next_session += wait_ms(rng, session_rate);
                continue;
            }
        };
        let (_, prompt, turns_left) = &mut open[index];
        prompt.extend(ids.take(1 + rng.below(3) as usize));
        lines.push(Line {
            timestamp_ms: now as u64,
            input_tokens: tokens(rng, prompt.len()),
            output_tokens: 50 + rng.below(400),
            blocks: prompt.clone(),
        });
        *turns_left -= 1;
        if *turns_left == 0 {
            open.swap_remove(index);
        } else {
            open[index].0 = now + 20_000.0 + wait_ms(rng, 1.0 / 60.0);
        }
    }
    lines
}

/// The trace `args` describe, as JSON lines.
fn render(args: &GenerateArgs) -> String {
    let mut rng = Rng::new(args.seed);
    let lines = match args.shape {
        Shape::Documents => documents(args, &mut rng),
        Shape::Sessions => sessions(args, &mut rng),
    };
    let mut text = String::new();
    for l in &lines {
        let line = json!({
            "timestamp": l.timestamp_ms,
            "input_length": l.input_tokens,
            "output_length": l.output_tokens,
            "hash_ids": l.blocks,
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

/// Most requests (and documents) one trace may have: the trace is built in memory, a few
/// hundred bytes a request.
const REQUESTS_MAX: usize = 2_000_000;
/// Slowest and fastest mean arrival rates, per second: slower, a trace's timestamps run past
/// what a millisecond count holds; faster, every arrival lands in the same millisecond.
const RATE_MIN: f64 = 1e-3;
const RATE_MAX: f64 = 1e6;

/// `kvhoard trace generate`.
pub fn generate(args: &GenerateArgs) -> anyhow::Result<ExitCode> {
    check(args)?;
    let text = render(args);
    match &args.output {
        Some(path) => crate::output::write_file(path, text.as_bytes())?,
        None => std::io::stdout().lock().write_all(text.as_bytes()).context("cannot write the trace")?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Every flag in range, naming the one that is not.
fn check(args: &GenerateArgs) -> anyhow::Result<()> {
    if !(1..=REQUESTS_MAX).contains(&args.requests) {
        bail!("--requests is {}: give between 1 and {REQUESTS_MAX} (the trace is built in memory)", args.requests);
    }
    if !(RATE_MIN..=RATE_MAX).contains(&args.rate) {
        bail!("--rate is {:?}: give between {RATE_MIN:?} and {RATE_MAX:?} requests per second", args.rate);
    }
    if let Some(documents) = args.documents.filter(|d| !(1..=REQUESTS_MAX).contains(d)) {
        bail!("--documents is {documents}: give between 1 and {REQUESTS_MAX}");
    }
    if !(args.zipf.is_finite() && args.zipf >= 0.0) {
        bail!("--zipf is {:?}: give 0 or more", args.zipf);
    }
    Ok(())
}

/// What a trace's reuse looks like.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Requests.
    pub requests: usize,
    /// Seconds from the first arrival to the last.
    pub duration_s: f64,
    /// Block references (every request's blocks).
    pub block_references: u64,
    /// Distinct blocks.
    pub distinct_blocks: u64,
    /// Hit rate of an unbounded cache keeping every block forever (longest stored prefix).
    pub ideal_hit_rate: f64,
    /// Share of distinct blocks referenced by more than one request.
    pub reused_blocks: f64,
    /// Mean prompt tokens.
    pub mean_input_tokens: f64,
}

/// Measures `trace`'s reuse.
pub fn stats(trace: &Trace) -> Stats {
    let mut seen: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
    let mut references = 0u64;
    let mut hits = 0u64;
    let mut tokens = 0u64;
    for r in &trace.requests {
        references += r.blocks.len() as u64;
        tokens += r.input_tokens;
        // The prefix is served while every block before it was stored.
        hits += r.blocks.iter().take_while(|b| seen.contains_key(b)).count() as u64;
        for &b in &r.blocks {
            *seen.entry(b).or_default() += 1;
        }
    }
    let distinct = seen.len() as u64;
    let reused = seen.values().filter(|&&n| n > 1).count();
    Stats {
        requests: trace.requests.len(),
        duration_s: trace.duration_s(),
        block_references: references,
        distinct_blocks: distinct,
        ideal_hit_rate: hits as f64 / references.max(1) as f64,
        reused_blocks: reused as f64 / distinct.max(1) as f64,
        mean_input_tokens: tokens as f64 / trace.requests.len().max(1) as f64,
    }
}

/// `kvhoard trace stats`.
pub fn print_stats(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let s = stats(&Trace::read(path)?);
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!("requests             {}", s.requests);
        println!("duration             {:.0} s", s.duration_s);
        println!("block references     {}", s.block_references);
        println!("distinct blocks      {}", s.distinct_blocks);
        println!("ideal hit rate       {:.3} (an unbounded cache that keeps everything)", s.ideal_hit_rate);
        println!("blocks read again    {:.3} of the distinct blocks", s.reused_blocks);
        println!("mean prompt          {:.0} tokens", s.mean_input_tokens);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(shape: Shape, seed: u64) -> GenerateArgs {
        GenerateArgs { shape, requests: 2000, rate: 2.0, documents: None, zipf: 0.9, seed, output: None }
    }

    #[test]
    fn flags_out_of_range_are_named() {
        assert!(check(&args(Shape::Documents, 1)).is_ok());
        let cases = [
            (GenerateArgs { requests: usize::MAX, ..args(Shape::Documents, 1) }, "--requests"),
            (GenerateArgs { requests: 0, ..args(Shape::Documents, 1) }, "--requests"),
            (GenerateArgs { documents: Some(usize::MAX), ..args(Shape::Documents, 1) }, "--documents"),
            (GenerateArgs { rate: 1e-308, ..args(Shape::Sessions, 1) }, "--rate is 1e-308"),
            (GenerateArgs { rate: f64::NAN, ..args(Shape::Sessions, 1) }, "--rate"),
            (GenerateArgs { zipf: f64::INFINITY, ..args(Shape::Documents, 1) }, "--zipf"),
        ];
        for (a, flag) in cases {
            let err = check(&a).unwrap_err().to_string();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    fn trace_of(a: &GenerateArgs) -> Trace {
        Trace::parse(&render(a)).expect("a generated trace parses")
    }

    #[test]
    fn generated_traces_parse_are_deterministic_and_differ_in_reuse() {
        for shape in [Shape::Documents, Shape::Sessions] {
            let a = trace_of(&args(shape, 7));
            let b = trace_of(&args(shape, 7));
            assert_eq!(a.requests, b.requests, "{shape:?}: the same seed gives the same trace");
            assert_ne!(a.requests, trace_of(&args(shape, 8)).requests, "{shape:?}: another seed another");
            assert_eq!(a.requests.len(), 2000);
        }
        let docs = stats(&trace_of(&args(Shape::Documents, 7)));
        let talk = stats(&trace_of(&args(Shape::Sessions, 7)));
        // Documents: most references go to a hot set read by many requests; sessions: a block is
        // read again by its own session's next turns.
        assert!(docs.ideal_hit_rate > 0.5, "{docs:?}");
        assert!(talk.ideal_hit_rate > 0.5, "{talk:?}");
        assert!(docs.reused_blocks < talk.reused_blocks, "documents have a long tail read once: {docs:?} {talk:?}");
    }

    #[test]
    fn stats_by_hand() {
        let t = Trace::parse(
            "{\"timestamp\":0,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[1,2]}\n\
             {\"timestamp\":1000,\"input_length\":1536,\"output_length\":1,\"hash_ids\":[1,2,3]}\n\
             {\"timestamp\":2000,\"input_length\":1024,\"output_length\":1,\"hash_ids\":[4,2]}\n",
        )
        .expect("parses");
        let s = stats(&t);
        assert_eq!((s.block_references, s.distinct_blocks), (7, 4));
        // Request 2 finds 1 and 2; request 3 misses 4, so 2 (stored) is not a prefix hit.
        assert!((s.ideal_hit_rate - 2.0 / 7.0).abs() < 1e-12);
        assert!((s.reused_blocks - 0.5).abs() < 1e-12);
        assert!((s.duration_s - 2.0).abs() < 1e-12);
    }
}
