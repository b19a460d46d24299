//! Request traces in Mooncake's format: one JSON object per line, in arrival order, with
//! `timestamp` (ms from the start), `input_length` and `output_length` (tokens) and `hash_ids`
//! (one id per 512-token block of the prompt, prefix-chained: requests sharing a prefix share
//! its leading ids, and an id always stands for the same content). Other fields are ignored;
//! a line that is not such an object is refused with its number.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use anyhow::{bail, Context};

/// Tokens one trace block stands for.
pub const BLOCK_TOKENS: u64 = 512;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Arrival, ms from the start of the trace.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// The prompt's blocks, in order.
    pub blocks: Vec<u64>,
}

/// A whole trace.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Requests in arrival order.
    pub requests: Vec<Request>,
    /// Blocks followed by more than one distinct block across the trace's prompts: where
    /// requests part ways (after a system prompt, a document, the start of a conversation).
    branches: HashSet<u64>,
}

#[derive(serde::Deserialize)]
struct Line {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// Longest prompt a trace request may have, in tokens (the longest context windows are about a
/// million): bounds the blocks one request makes a replay look up.
pub const PROMPT_TOKENS_MAX: u64 = 1 << 22;

impl Trace {
    /// Reads a trace file (`-`: standard input).
    pub fn read(path: &Path) -> anyhow::Result<Trace> {
        let text = if path == Path::new("-") {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
                .context("cannot read the trace from standard input")?;
            text
        } else {
            std::fs::read_to_string(path).with_context(|| format!("cannot read the trace {}", path.display()))?
        };
        Trace::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses a trace; fails at the first bad line, saying which and why.
    pub fn parse(text: &str) -> anyhow::Result<Trace> {
        let mut requests = Vec::new();
        let mut last = 0;
        // A byte-order mark, as some editors save, is not part of the first request.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let l: Line = serde_json::from_str(line).with_context(|| {
                format!(
                    "line {n} is not a request (a JSON object with timestamp, input_length, output_length, hash_ids)"
                )
            })?;
            if l.timestamp < last {
                bail!(
                    "line {n}: timestamp {} is before the previous line's ({last}); requests must be in arrival order",
                    l.timestamp
                );
            }
            if l.hash_ids.is_empty() && l.input_length > 0 {
                bail!("line {n}: a prompt of {} tokens with no hash_ids", l.input_length);
            }
            if l.input_length > PROMPT_TOKENS_MAX {
                bail!("line {n}: a prompt of {} tokens; a request has at most {PROMPT_TOKENS_MAX}", l.input_length);
            }
            if l.hash_ids.len() as u64 != l.input_length.div_ceil(BLOCK_TOKENS) {
                bail!(
                    "line {n}: {} hash_ids for {} prompt tokens; expected one per {BLOCK_TOKENS} tokens ({})",
                    l.hash_ids.len(),
                    l.input_length,
                    l.input_length.div_ceil(BLOCK_TOKENS)
                );
            }
            last = l.timestamp;
            requests.push(Request {
                timestamp_ms: l.timestamp,
                input_tokens: l.input_length,
                output_tokens: l.output_length,
                blocks: l.hash_ids,
            });
        }
        if requests.is_empty() {
            bail!("the trace holds no request");
        }
        Ok(Trace::new(requests))
    }

    /// A trace of `requests`.
    pub fn new(requests: Vec<Request>) -> Trace {
        let mut next: HashMap<u64, u64> = HashMap::new();
        let mut branches = HashSet::new();
        for pair in requests.iter().flat_map(|r| r.blocks.windows(2)) {
            let [block, after] = pair else { continue };
            match next.entry(*block) {
                Entry::Vacant(e) => {
                    e.insert(*after);
                }
                Entry::Occupied(e) if e.get() != after => {
                    branches.insert(*block);
                }
                Entry::Occupied(_) => {}
            }
        }
        Trace { requests, branches }
    }

    /// How many of `r`'s leading blocks it shares with requests that part ways from it: up to
    /// and including the first block where the trace's prompts branch (0 when none does).
    fn split(&self, r: &Request) -> usize {
        r.blocks.iter().position(|b| self.branches.contains(b)).map_or(0, |i| i + 1)
    }

    /// The first `n` requests.
    pub fn slice(&self, n: usize) -> Trace {
        Trace::new(self.requests.iter().take(n).cloned().collect())
    }

    /// The context `r` belongs to: the prefix subtree below the first point where the trace's
    /// requests part ways on its path (below a system prompt, a conversation; a document's
    /// questions below the document), named by its first block; the request's first block when
    /// its path never branches, its last when it holds nothing below the branch.
    pub fn context(&self, r: &Request) -> u64 {
        r.blocks.get(self.split(r)).or(r.blocks.last()).copied().unwrap_or(0)
    }

    /// `r`'s blocks as runs of one context each, in order, as (context, block indices): the
    /// prefix it shares with requests that part ways from it (a system prompt, a document) is a
    /// context of its own, named by its last block, since each of those requests reads it; the
    /// rest is the request's [`Trace::context`].
    pub fn contexts_of(&self, r: &Request) -> Vec<(u64, std::ops::Range<usize>)> {
        let split = self.split(r).min(r.blocks.len());
        let prefix = split.checked_sub(1).and_then(|last| r.blocks.get(last)).copied();
        let shared = prefix.map(|p| (p, 0..split));
        let own = Some((self.context(r), split..r.blocks.len())).filter(|(_, run)| !run.is_empty());
        shared.into_iter().chain(own).collect()
    }

    /// Distinct blocks.
    pub fn distinct_blocks(&self) -> u64 {
        let mut ids: Vec<u64> = self.requests.iter().flat_map(|r| r.blocks.iter().copied()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len() as u64
    }

    /// Seconds from the first request to the last.
    pub fn duration_s(&self) -> f64 {
        let first = self.requests.first().map_or(0, |r| r.timestamp_ms);
        let last = self.requests.last().map_or(0, |r| r.timestamp_ms);
        (last - first) as f64 / 1000.0
    }
}

/// Tokens of block `index` of a request with `input_tokens` prompt tokens (the last block may be
/// partial).
pub fn block_tokens(index: usize, blocks: usize, input_tokens: u64) -> u64 {
    if index + 1 < blocks {
        BLOCK_TOKENS
    } else {
        input_tokens.saturating_sub(BLOCK_TOKENS * (blocks as u64 - 1)).clamp(1, BLOCK_TOKENS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_bad_ones_are_named() {
        let t = Trace::parse(
            "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\n\
             {\"timestamp\": 7, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0], \"extra\": 1}\n",
        )
        .expect("parses");
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[0].blocks, vec![0, 1]);
        assert_eq!(t.distinct_blocks(), 2);
        for (text, want) in [
            ("{\"timestamp\": 0}", "line 1 is not a request"),
            ("{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}", "line 2: timestamp 4"),
            ("{\"timestamp\": 0, \"input_length\": 2000, \"output_length\": 1, \"hash_ids\": [1]}", "line 1: 1 hash_ids for 2000"),
            ("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, 2]}", "line 1: 2 hash_ids for 10"),
            ("{\"timestamp\": 0, \"input_length\": 99999999999, \"output_length\": 1, \"hash_ids\": [1]}", "at most 4194304"),
            ("not json", "line 1"),
            ("", "no request"),
        ] {
            let err = format!("{:#}", Trace::parse(text).unwrap_err());
            assert!(err.contains(want), "{text:?}: {err}");
        }
        let bom =
            Trace::parse("\u{feff}{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [4]}");
        assert_eq!(bom.expect("a byte-order mark is skipped").requests.len(), 1);
        assert_eq!(block_tokens(1, 2, 600), 88);
        // Both requests start with block 0: contexts are named by the block after it.
        let t = Trace::parse(
            "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [0, 1, 2]}\n\
             {\"timestamp\": 1, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [0, 5, 6]}\n\
             {\"timestamp\": 2, \"input_length\": 500, \"output_length\": 5, \"hash_ids\": [0]}\n",
        )
        .expect("parses");
        let contexts: Vec<u64> = t.requests.iter().map(|r| t.context(r)).collect();
        assert_eq!(contexts, vec![1, 5, 0]);
        // The shared block is a context of its own, whoever stored it first.
        let runs: Vec<_> = t.requests.iter().map(|r| t.contexts_of(r)).collect();
        assert_eq!(runs[0], vec![(0, 0..1), (1, 1..3)]);
        assert_eq!(runs[1], vec![(0, 0..1), (5, 1..3)]);
        assert_eq!(runs[2], vec![(0, 0..1)]);
        // Nothing shared by all: one run, the request's context.
        let t = Trace::parse(
            "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [3, 4]}\n\
             {\"timestamp\": 1, \"input_length\": 500, \"output_length\": 5, \"hash_ids\": [7]}\n",
        )
        .expect("parses");
        assert_eq!(t.contexts_of(&t.requests[0]), vec![(3, 0..2)]);
        assert_eq!(t.contexts_of(&t.requests[1]), vec![(7, 0..1)]);
        assert_eq!(block_tokens(0, 2, 600), 512);
        // Two system prompts, a conversation below each that goes on for two turns: each
        // conversation is a context below its prompt, the prompts contexts of their own.
        let t = Trace::parse(
            "{\"timestamp\": 0, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [10, 11, 20]}\n\
             {\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [30, 31]}\n\
             {\"timestamp\": 2, \"input_length\": 1500, \"output_length\": 5, \"hash_ids\": [10, 11, 40]}\n\
             {\"timestamp\": 3, \"input_length\": 2000, \"output_length\": 5, \"hash_ids\": [10, 11, 20, 21]}\n",
        )
        .expect("parses");
        let runs: Vec<_> = t.requests.iter().map(|r| t.contexts_of(r)).collect();
        assert_eq!(runs[0], vec![(11, 0..2), (20, 2..3)]);
        assert_eq!(runs[1], vec![(30, 0..2)], "a prompt no other request shares: one context");
        assert_eq!(runs[2], vec![(11, 0..2), (40, 2..3)]);
        assert_eq!(runs[3], vec![(11, 0..2), (20, 2..4)], "the next turn of the first conversation");
    }
}
