//! What a codec does, as data: parsed from and printed to a short string such as
//! `drop-knorm:keep=0.5+quant:bits=4`, and stored with every compressed block
//! ([`crate::CodecParams`]).

use crate::Error;

/// A codec configuration: an optional dropping stage, then an encoding of what is kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecSpec {
    /// The dropping stage, if any.
    pub drop: Option<DropSpec>,
    /// How what is kept is encoded.
    pub encoding: Encoding,
}

/// How the kept tokens are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// The bytes as they are.
    Raw,
    /// Byte planes (high bytes together, low bytes together), each compressed into a zstd
    /// frame. Bit-exact.
    Lossless {
        /// Up to 1 (the default): zstd's Huffman coder alone, with zstd's level 1 where matches
        /// pay; above 1, zstd at that level (docs/decisions/0007).
        level: i32,
    },
    /// KIVI-style asymmetric min/max quantization: keys per channel over groups of `group`
    /// tokens, values per token over groups of `group` channels, `bits` per value, the last
    /// `residual` tokens kept in full precision.
    Quant {
        /// Bits per value: 2, 4 or 8.
        bits: u8,
        /// Values per group sharing a minimum and a scale.
        group: u32,
        /// Recent tokens kept in full precision.
        residual: u32,
    },
}

/// Which tokens to keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropSpec {
    /// How tokens are chosen.
    pub method: DropMethod,
    /// Fraction of the tokens (pages for [`DropMethod::Paged`]) kept, in (0, 1].
    pub keep_fraction: f32,
    /// Choose a kept set per layer and KV head instead of one for the whole block. A paged
    /// serving engine can only load the shared form.
    pub per_head: bool,
}

/// How a dropping stage scores tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropMethod {
    /// Drop the tokens with the largest key L2 norm.
    KNorm,
    /// Drop the tokens whose normalized key is closest (cosine) to the mean normalized key.
    KeyDiff,
    /// Keep `sink` tokens at the start and the most recent ones.
    Streaming {
        /// Tokens kept at the start.
        sink: u32,
    },
    /// PagedEviction: drop whole pages of `page` tokens with the lowest mean ||V|| / ||K||,
    /// always keeping the first and last page.
    Paged {
        /// Tokens per page (a paged block's own page size wins).
        page: u32,
    },
    /// SnapKV: score tokens by the attention of client-supplied observation-window queries,
    /// smoothed by an average pool of width `pool`.
    SnapKv {
        /// Width of the average pool (odd).
        pool: u32,
    },
}

/// Level 1: byte planes Huffman-coded by zstd without matches, which on bf16 KV planes compresses
/// better than zstd's levels 1 and 3 (0.676 against 0.689 and 0.716 of the raw size on generated
/// blocks) and decompresses 1.7x as fast as zstd's level 1 (docs/decisions/0007).
pub const DEFAULT_LEVEL: i32 = 1;
/// Quantization bits when a spec gives none.
pub const DEFAULT_BITS: u8 = 4;
/// Quantization group when a spec gives none (KIVI's).
pub const DEFAULT_GROUP: u32 = 32;
/// StreamingLLM sink tokens when a spec gives none.
pub const DEFAULT_SINK: u32 = 4;
/// PagedEviction page size when a spec gives none (vLLM's block size).
pub const DEFAULT_PAGE: u32 = 16;
/// SnapKV pool width when a spec gives none.
pub const DEFAULT_POOL: u32 = 5;
const MAX_GROUP: u32 = 1 << 16;

impl Encoding {
    pub(crate) fn id(&self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Lossless { .. } => 1,
            Encoding::Quant { .. } => 2,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        match *self {
            Encoding::Raw => Ok(()),
            Encoding::Lossless { level } => {
                if zstd::compression_level_range().contains(&level) {
                    Ok(())
                } else {
                    Err(Error::Invalid(format!(
                        "lossless level {level} is outside zstd's range {:?}",
                        zstd::compression_level_range()
                    )))
                }
            }
            Encoding::Quant { bits, group, residual: _ } => {
                if !matches!(bits, 2 | 4 | 8) {
                    return Err(Error::Invalid(format!("quant bits must be 2, 4 or 8, not {bits}")));
                }
                if group == 0 || group > MAX_GROUP {
                    return Err(Error::Invalid(format!("quant group must be between 1 and {MAX_GROUP}, not {group}")));
                }
                Ok(())
            }
        }
    }
}

impl DropMethod {
    pub(crate) fn id(&self) -> u8 {
        match self {
            DropMethod::KNorm => 1,
            DropMethod::KeyDiff => 2,
            DropMethod::Streaming { .. } => 3,
            DropMethod::Paged { .. } => 4,
            DropMethod::SnapKv { .. } => 5,
        }
    }

    /// The method's one numeric parameter, as stored in a frame.
    pub(crate) fn param(&self) -> u32 {
        match *self {
            DropMethod::KNorm | DropMethod::KeyDiff => 0,
            DropMethod::Streaming { sink } => sink,
            DropMethod::Paged { page } => page,
            DropMethod::SnapKv { pool } => pool,
        }
    }

    pub(crate) fn from_id(id: u8, param: u32) -> Option<DropMethod> {
        Some(match id {
            1 => DropMethod::KNorm,
            2 => DropMethod::KeyDiff,
            3 => DropMethod::Streaming { sink: param },
            4 => DropMethod::Paged { page: param },
            5 => DropMethod::SnapKv { pool: param },
            _ => return None,
        })
    }

    fn name(&self) -> &'static str {
        match self {
            DropMethod::KNorm => "drop-knorm",
            DropMethod::KeyDiff => "drop-keydiff",
            DropMethod::Streaming { .. } => "drop-streaming",
            DropMethod::Paged { .. } => "drop-paged",
            DropMethod::SnapKv { .. } => "drop-snapkv",
        }
    }
}

impl DropSpec {
    fn validate(&self) -> Result<(), Error> {
        if !(self.keep_fraction > 0.0 && self.keep_fraction <= 1.0) {
            return Err(Error::Invalid(format!("keep fraction must be in (0, 1], not {}", self.keep_fraction)));
        }
        match self.method {
            DropMethod::Paged { page: 0 } => Err(Error::Invalid("drop-paged page size must be at least 1".into())),
            DropMethod::SnapKv { pool } if pool % 2 == 0 => {
                Err(Error::Invalid(format!("drop-snapkv pool width must be odd (centred on the token), not {pool}")))
            }
            _ => Ok(()),
        }
    }
}

impl CodecSpec {
    /// Stored as given.
    pub const RAW: CodecSpec = CodecSpec { drop: None, encoding: Encoding::Raw };

    /// Byte-plane lossless at zstd `level`.
    pub fn lossless(level: i32) -> CodecSpec {
        CodecSpec { drop: None, encoding: Encoding::Lossless { level } }
    }

    /// Quantization to `bits` bits in groups of `group`, the last `residual` tokens in full
    /// precision.
    pub fn quant(bits: u8, group: u32, residual: u32) -> CodecSpec {
        CodecSpec { drop: None, encoding: Encoding::Quant { bits, group, residual } }
    }

    /// Whether decoding gives back other bytes than were compressed (quantization, dropping).
    pub fn is_lossy(&self) -> bool {
        self.drop.is_some() || matches!(self.encoding, Encoding::Quant { .. })
    }

    /// Whether the decoded block has fewer tokens than the original (a dropping stage).
    pub fn drops_tokens(&self) -> bool {
        self.drop.is_some()
    }

    /// Whether this stores the bytes as they are (no dropping, no encoding).
    pub fn is_raw(&self) -> bool {
        self.drop.is_none() && self.encoding == Encoding::Raw
    }

    /// This encoding after a dropping stage keeping `keep_fraction` of the tokens.
    pub fn with_drop(self, method: DropMethod, keep_fraction: f32) -> CodecSpec {
        CodecSpec { drop: Some(DropSpec { method, keep_fraction, per_head: false }), ..self }
    }

    /// Checks every parameter's range.
    pub fn validate(&self) -> Result<(), Error> {
        self.encoding.validate()?;
        if let Some(drop) = &self.drop {
            drop.validate()?;
        }
        Ok(())
    }

    /// Parses `STAGE[+STAGE]`, where a stage is `NAME[:KEY=VALUE,...]`: at most one `drop-*`
    /// stage, first, and at most one of `raw`, `lossless`, `quant`.
    pub fn parse(text: &str) -> Result<CodecSpec, Error> {
        let mut spec = CodecSpec::RAW;
        let mut have_encoding = false;
        for (index, stage) in text.split('+').enumerate() {
            let (name, args) = match stage.split_once(':') {
                Some((name, args)) => (name.trim(), args),
                None => (stage.trim(), ""),
            };
            let mut args = Args::parse(name, args)?;
            if let Some(method) = name.strip_prefix("drop-") {
                if index != 0 {
                    return Err(Error::Invalid(format!("{text:?}: a drop stage must come first, and only one")));
                }
                let method = match method {
                    "knorm" => DropMethod::KNorm,
                    "keydiff" => DropMethod::KeyDiff,
                    "streaming" => DropMethod::Streaming { sink: args.number("sink", DEFAULT_SINK)? },
                    "paged" => DropMethod::Paged { page: args.number("page", DEFAULT_PAGE)? },
                    "snapkv" => DropMethod::SnapKv { pool: args.number("pool", DEFAULT_POOL)? },
                    _ => return Err(unknown(name)),
                };
                spec.drop = Some(DropSpec {
                    method,
                    keep_fraction: args.number("keep", 0.5f32)?,
                    per_head: args.flag("per-head"),
                });
            } else {
                if have_encoding {
                    return Err(Error::Invalid(format!("{text:?}: only one of raw, lossless and quant may be given")));
                }
                have_encoding = true;
                spec.encoding = match name {
                    "raw" | "none" => Encoding::Raw,
                    "lossless" => Encoding::Lossless { level: args.number("level", DEFAULT_LEVEL)? },
                    "quant" => Encoding::Quant {
                        bits: args.number("bits", DEFAULT_BITS)?,
                        group: args.number("group", DEFAULT_GROUP)?,
                        residual: args.number("residual", 0)?,
                    },
                    _ => return Err(unknown(name)),
                };
            }
            args.finish()?;
        }
        spec.validate()?;
        Ok(spec)
    }
}

fn unknown(name: &str) -> Error {
    Error::Invalid(format!(
        "unknown codec stage {name:?}; expected raw, lossless, quant, drop-knorm, drop-keydiff, \
         drop-streaming, drop-paged or drop-snapkv"
    ))
}

/// `key=value` and bare-flag arguments of one stage; every one must be used.
struct Args<'a> {
    stage: &'a str,
    items: Vec<(&'a str, Option<&'a str>)>,
}

impl<'a> Args<'a> {
    fn parse(stage: &'a str, text: &'a str) -> Result<Args<'a>, Error> {
        let items = text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (item, None),
            })
            .collect();
        Ok(Args { stage, items })
    }

    fn take(&mut self, key: &str) -> Option<Option<&'a str>> {
        let position = self.items.iter().position(|(k, _)| *k == key)?;
        Some(self.items.swap_remove(position).1)
    }

    fn number<T: std::str::FromStr>(&mut self, key: &str, default: T) -> Result<T, Error> {
        match self.take(key) {
            None => Ok(default),
            Some(Some(value)) => value
                .parse()
                .map_err(|_| Error::Invalid(format!("{}: {key}={value:?} is not a valid number", self.stage))),
            Some(None) => Err(Error::Invalid(format!("{}: {key} needs a value ({key}=...)", self.stage))),
        }
    }

    fn flag(&mut self, key: &str) -> bool {
        self.take(key).is_some()
    }

    fn finish(self) -> Result<(), Error> {
        match self.items.first() {
            None => Ok(()),
            Some((key, _)) => Err(Error::Invalid(format!("{}: unknown parameter {key:?}", self.stage))),
        }
    }
}

impl std::fmt::Display for CodecSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(drop) = &self.drop {
            write!(f, "{}:keep={}", drop.method.name(), drop.keep_fraction)?;
            match drop.method {
                DropMethod::Streaming { sink } => write!(f, ",sink={sink}")?,
                DropMethod::Paged { page } => write!(f, ",page={page}")?,
                DropMethod::SnapKv { pool } => write!(f, ",pool={pool}")?,
                DropMethod::KNorm | DropMethod::KeyDiff => {}
            }
            if drop.per_head {
                f.write_str(",per-head")?;
            }
            f.write_str("+")?;
        }
        match self.encoding {
            Encoding::Raw => f.write_str("raw"),
            Encoding::Lossless { level } => write!(f, "lossless:level={level}"),
            Encoding::Quant { bits, group, residual } => {
                write!(f, "quant:bits={bits},group={group},residual={residual}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for text in [
            "raw",
            "lossless:level=3",
            "quant:bits=2,group=64,residual=128",
            "drop-knorm:keep=0.5+raw",
            "drop-keydiff:keep=0.25,per-head+quant:bits=4,group=32,residual=0",
            "drop-streaming:keep=0.3,sink=4+lossless:level=1",
            "drop-paged:keep=0.5,page=16+raw",
            "drop-snapkv:keep=0.5,pool=5+raw",
        ] {
            let spec = CodecSpec::parse(text).unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(CodecSpec::parse(&spec.to_string()).unwrap(), spec);
        }
        assert_eq!(CodecSpec::parse("quant").unwrap(), CodecSpec::quant(4, 32, 0));
        assert_eq!(CodecSpec::parse("drop-knorm:keep=0.5").unwrap().encoding, Encoding::Raw);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (text, needle) in [
            ("quant:bits=3", "2, 4 or 8"),
            ("quant:group=0", "group"),
            ("quant:bits=x", "not a valid number"),
            ("lossless:level=99", "range"),
            ("quant:colour=red", "unknown parameter"),
            ("zip", "unknown codec stage"),
            ("quant+lossless", "only one"),
            ("quant+drop-knorm", "must come first"),
            ("drop-knorm:keep=0", "keep fraction"),
            ("drop-knorm:keep=1.5", "keep fraction"),
            ("drop-knorm:keep=NaN", "keep fraction"),
            ("drop-paged:page=0", "page size"),
            ("drop-snapkv:pool=4", "odd"),
            ("quant:bits", "needs a value"),
        ] {
            let error = CodecSpec::parse(text).unwrap_err().to_string();
            assert!(error.contains(needle), "{text}: {error}");
        }
    }
}
