//! Namespace policies: the codec a namespace's blocks are stored with when a put names none,
//! whether lossy codecs may be applied in it, and how placement treats it ([`NsSettings`]: the
//! planner's α, allowed codecs and drift threshold; group TTL's budget, groups and window). Kept
//! with the superblock (`kvhoard_format::policy`); lossy codecs are denied unless a policy allows
//! them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use kvhoard_format::policy::{NsPolicy, NsSettings as StoredSettings};
use kvhoard_kernels::CodecSpec;

use crate::error::{Result, StoreError};

/// Quality drift that re-scores a context when its namespace sets none: 5 % below what the
/// planner assumed.
pub const DEFAULT_DRIFT: f64 = 0.05;

/// Most groups group TTL gives a TTL of their own in one namespace: planning costs grow with
/// the square of groups × candidates.
pub const MAX_TTL_GROUPS: u32 = 4096;

/// One namespace's policy.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policy {
    /// Codec for puts that name none (`None`: store blocks as they are).
    pub codec: Option<CodecSpec>,
    /// Whether lossy codecs (quantization, token dropping) may be applied.
    pub lossy: bool,
    /// How placement treats the namespace.
    pub settings: NsSettings,
}

/// How placement treats a namespace (each `None`: the placement's own default).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NsSettings {
    /// The planner's α: seconds of delay a block's whole quality is worth.
    pub alpha: Option<f64>,
    /// The codecs the planner may store the namespace's blocks with, besides the form they were
    /// put in, matched exactly (codec and parameters) against the planner's own (`None`: all of
    /// its codecs; `raw` alone: none but the form as put).
    pub codecs: Option<Arc<[CodecSpec]>>,
    /// How far (a fraction) a reported quality may fall below what the planner assumed before the
    /// context is re-scored (`None`: [`DEFAULT_DRIFT`]).
    pub drift: Option<f64>,
    /// Group TTL for the namespace's blocks put without a TTL of their own.
    pub ttl: Option<TtlSettings>,
}

/// Group TTL's settings for a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlSettings {
    /// Bytes the namespace's TTLs may keep stored, on average over the window.
    pub budget_bytes: u64,
    /// Groups with a TTL of their own (the rest share one); 0: the default.
    pub groups: u32,
    /// Seconds of access history the TTLs are learned from; 0: the default.
    pub window_s: u32,
}

impl NsSettings {
    /// Checks each setting's range.
    pub fn validate(&self) -> Result<()> {
        if let Some(alpha) = self.alpha.filter(|a| !(a.is_finite() && (0.0..=1e6).contains(a))) {
            return Err(StoreError::invalid("alpha", format!("{alpha:?} is not seconds between 0 and 10^6")));
        }
        if let Some(drift) = self.drift.filter(|d| !(d.is_finite() && (0.0..=1.0).contains(d))) {
            return Err(StoreError::invalid("drift", format!("{drift:?} is not a fraction between 0 and 1")));
        }
        if self.ttl.is_some_and(|t| t.budget_bytes == 0) {
            return Err(StoreError::invalid("ttl budget", "a group TTL budget must be above 0 bytes"));
        }
        if let Some(t) = self.ttl.filter(|t| t.groups > MAX_TTL_GROUPS) {
            return Err(StoreError::invalid(
                "ttl groups",
                format!("{} groups; at most {MAX_TTL_GROUPS} get a TTL of their own", t.groups),
            ));
        }
        if self.codecs.as_deref().is_some_and(<[CodecSpec]>::is_empty) {
            return Err(StoreError::invalid(
                "codecs",
                "no codec listed; list `raw` to keep blocks only in the form they were put in",
            ));
        }
        Ok(())
    }

    /// Whether the planner may store the namespace's blocks with `codec` (`None`: as put).
    pub fn allows(&self, codec: Option<&CodecSpec>) -> bool {
        match (codec, &self.codecs) {
            (None, _) | (_, None) => true,
            (Some(c), Some(allowed)) => allowed.contains(c),
        }
    }

    /// The drift threshold in force.
    pub fn drift(&self) -> f64 {
        self.drift.unwrap_or(DEFAULT_DRIFT)
    }

    fn is_default(&self) -> bool {
        *self == NsSettings::default()
    }

    fn stored(&self) -> Option<StoredSettings> {
        if self.is_default() {
            return None;
        }
        let micro = |v: f64| (v * 1e6).round() as u64;
        Some(StoredSettings {
            alpha_us: self.alpha.map(micro),
            drift_ppm: self.drift.map(micro),
            ttl_budget_bytes: self.ttl.map_or(0, |t| t.budget_bytes),
            ttl_groups: self.ttl.map_or(0, |t| t.groups),
            ttl_window_s: self.ttl.map_or(0, |t| t.window_s),
            codecs: self
                .codecs
                .as_deref()
                .map(|c| c.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
        })
    }

    /// The settings stored for `namespace`. A codec this build cannot parse (written by a newer
    /// one) is left out of the allowed ones, logged.
    fn load(namespace: &str, stored: &StoredSettings) -> NsSettings {
        let codecs = (!stored.codecs.is_empty()).then(|| {
            stored
                .codecs
                .split(' ')
                .filter_map(|text| {
                    CodecSpec::parse(text)
                        .map_err(|e| tracing::error!(namespace, codec = text, error = %e, "unusable codec among a namespace's allowed codecs; left out"))
                        .ok()
                })
                .collect::<Arc<[CodecSpec]>>()
        });
        NsSettings {
            alpha: stored.alpha_us.map(|v| v as f64 / 1e6),
            codecs,
            drift: stored.drift_ppm.map(|v| v as f64 / 1e6),
            ttl: (stored.ttl_budget_bytes > 0).then_some(TtlSettings {
                budget_bytes: stored.ttl_budget_bytes,
                groups: stored.ttl_groups,
                window_s: stored.ttl_window_s,
            }),
        }
    }
}

impl Policy {
    /// Checks that the policy allows its own codec, and its settings.
    pub fn validate(&self) -> Result<()> {
        self.settings.validate()?;
        if let Some(c) = self.settings.codecs.iter().flat_map(|c| c.iter()).find(|c| c.is_lossy() && !self.lossy) {
            return Err(StoreError::invalid(
                "codecs",
                format!("codec {c} is lossy; allow lossy codecs in the namespace too (`kvhoard ns set ... --lossy allow`, or lossy=True)"),
            ));
        }
        match self.codec {
            Some(spec) if spec.is_lossy() && !self.lossy => Err(StoreError::invalid(
                "policy",
                format!("codec {spec} is lossy; allow lossy codecs in the namespace too (--lossy allow)"),
            )),
            _ => Ok(()),
        }
    }

    /// The codec a put applies when it asks for `asked` (`None`: the policy's default): the raw
    /// form is `None`. Refuses a lossy codec where lossy codecs are denied.
    pub fn codec_for(&self, namespace: &str, asked: Option<CodecSpec>) -> Result<Option<CodecSpec>> {
        let spec = asked.or(self.codec).filter(|s| !s.is_raw());
        match spec {
            Some(s) if s.is_lossy() && !self.lossy => Err(StoreError::invalid(
                "codec",
                format!(
                    "namespace {namespace:?} does not allow lossy codecs such as {s}; allow them with \
                     `kvhoard ns set VOLUME {namespace} --lossy allow`"
                ),
            )),
            other => Ok(other),
        }
    }
}

impl Policy {
    /// Refuses a block compressed by the caller with a lossy codec (or one this build does not
    /// know) where lossy codecs are denied.
    pub fn allows_frame(&self, namespace: &str, meta: &kvhoard_format::CompressionMeta) -> Result<()> {
        let class = kvhoard_kernels::codec_class(meta);
        let lossless = class <= 1;
        if lossless || self.lossy {
            return Ok(());
        }
        Err(StoreError::invalid(
            "compression",
            format!(
                "namespace {namespace:?} does not allow lossy codecs, and this block is stored with one ({}); allow them \
                 with `kvhoard ns set VOLUME {namespace} --lossy allow`",
                kvhoard_kernels::class_name(class)
            ),
        ))
    }
}

/// Every namespace's policy, in memory.
#[derive(Debug, Default)]
pub(crate) struct Policies {
    map: RwLock<BTreeMap<String, Policy>>,
}

impl Policies {
    /// The policies stored with the volume. A codec this build cannot parse (written by a newer
    /// one) is dropped, logged: blocks are then stored as they are.
    pub(crate) fn load(stored: Vec<NsPolicy>) -> Policies {
        let map = stored
            .into_iter()
            .map(|p| {
                let codec = match p.codec.as_str() {
                    "" => None,
                    text => CodecSpec::parse(text)
                        .map_err(|e| tracing::error!(namespace = %p.namespace, codec = text, error = %e, "unusable codec in a namespace policy; storing its blocks uncompressed"))
                        .ok(),
                };
                let settings = p.settings.as_ref().map(|s| NsSettings::load(&p.namespace, s)).unwrap_or_default();
                (p.namespace, Policy { codec, lossy: p.lossy, settings })
            })
            .collect();
        Policies { map: RwLock::new(map) }
    }

    /// The policy of `namespace` (the default when none was set).
    pub(crate) fn get(&self, namespace: &str) -> Policy {
        self.map.read().unwrap_or_else(|e| e.into_inner()).get(namespace).cloned().unwrap_or_default()
    }

    /// Every policy set.
    pub(crate) fn all(&self) -> Vec<(String, Policy)> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(n, p)| (n.clone(), p.clone())).collect()
    }

    /// The stored form of every policy with `namespace`'s replaced by `policy` (removed when it
    /// is the default).
    pub(crate) fn with(&self, namespace: &str, policy: Policy) -> Vec<NsPolicy> {
        let mut map = self.map.read().unwrap_or_else(|e| e.into_inner()).clone();
        if policy == Policy::default() {
            map.remove(namespace);
        } else {
            map.insert(namespace.to_string(), policy);
        }
        map.into_iter().map(|(namespace, p)| stored(namespace, p)).collect()
    }

    /// The stored form of every policy.
    pub(crate) fn stored(&self) -> Vec<NsPolicy> {
        self.all().into_iter().map(|(namespace, p)| stored(namespace, p)).collect()
    }

    /// Makes `policy` `namespace`'s (after it was stored).
    pub(crate) fn set(&self, namespace: &str, policy: Policy) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if policy == Policy::default() {
            map.remove(namespace);
        } else {
            map.insert(namespace.to_string(), policy);
        }
    }
}

/// A namespace's policy as the superblock keeps it.
fn stored(namespace: String, p: Policy) -> NsPolicy {
    NsPolicy {
        codec: p.codec.map_or_else(String::new, |c| c.to_string()),
        lossy: p.lossy,
        settings: p.settings.stored(),
        namespace,
    }
}
