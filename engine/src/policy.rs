//! Namespace policies: the codec a namespace's blocks are stored with when a put names none, and
//! whether lossy codecs may be applied in it. Kept with the superblock
//! (`kvhoard_format::policy`); lossy codecs are denied unless a policy allows them.

use std::collections::BTreeMap;
use std::sync::RwLock;

use kvhoard_format::policy::NsPolicy;
use kvhoard_kernels::CodecSpec;

use crate::error::{Result, StoreError};

/// One namespace's policy.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Policy {
    /// Codec for puts that name none (`None`: store blocks as they are).
    pub codec: Option<CodecSpec>,
    /// Whether lossy codecs (quantization, token dropping) may be applied.
    pub lossy: bool,
}

impl Policy {
    /// Checks that the policy allows its own codec.
    pub fn validate(&self) -> Result<()> {
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
                (p.namespace, Policy { codec, lossy: p.lossy })
            })
            .collect();
        Policies { map: RwLock::new(map) }
    }

    /// The policy of `namespace` (the default when none was set).
    pub(crate) fn get(&self, namespace: &str) -> Policy {
        self.map.read().unwrap_or_else(|e| e.into_inner()).get(namespace).copied().unwrap_or_default()
    }

    /// Every policy set.
    pub(crate) fn all(&self) -> Vec<(String, Policy)> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(n, p)| (n.clone(), *p)).collect()
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
        map.into_iter()
            .map(|(namespace, p)| NsPolicy {
                namespace,
                codec: p.codec.map_or_else(String::new, |c| c.to_string()),
                lossy: p.lossy,
            })
            .collect()
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
