//! Quality sampled on the lossy forms placement chose: one block in [`QUALITY_SAMPLE_EVERY`]
//! stored in such a form from its original bytes (put in it, or recoded to it by cleaning) is
//! decoded again and compared with the original, and the estimate goes to placement as a
//! client's quality report for the block's context would.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::codec::Compressed;
use crate::parts::Parts;
use crate::placement::context_of;

/// Blocks stored in a lossy form per quality estimate: an estimate decodes the new form and
/// compares attention outputs with the original, about as much CPU as compressing it.
pub(crate) const QUALITY_SAMPLE_EVERY: u64 = 16;

/// A block whose lossy form may be sampled for the quality it keeps.
pub(super) struct Sampled<'a> {
    pub(super) namespace: &'a str,
    pub(super) key: &'a str,
    pub(super) group: Option<u64>,
    pub(super) desc: &'a kvhoard_format::BlockDesc,
}

impl Parts {
    /// One block in [`QUALITY_SAMPLE_EVERY`] stored in a lossy form placement chose, from its
    /// original bytes (when cleaning recodes it, or when a put is admitted in that form;
    /// `counter` counts each kind): estimates the quality the form keeps and tells placement,
    /// as a client's report of the block's context would (a planner scores the context again
    /// when it is below what it assumed by more than the namespace's drift).
    pub(super) fn sample_quality(
        &self,
        block: &Sampled<'_>,
        original: &[u8],
        compressed: &Compressed,
        counter: &AtomicU64,
    ) {
        if !counter.fetch_add(1, Ordering::Relaxed).is_multiple_of(QUALITY_SAMPLE_EVERY) {
            return;
        }
        let Some(quality) = self.codecs.quality(block.desc, original, compressed, &self.pool) else { return };
        self.metrics.quality_samples.fetch_add(1, Ordering::Relaxed);
        let Sampled { namespace, key, group, .. } = *block;
        let drift = self.policies.get(namespace).settings.drift();
        let context = context_of(group, namespace, key);
        if self.placement.report_quality(context, quality, drift) {
            self.metrics.quality_rescored.fetch_add(1, Ordering::Relaxed);
        }
    }
}
