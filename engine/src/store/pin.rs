//! Pins: the API of `crate::reclaim::Pins`, which reclaim consults.

use kvhoard_format::record::{validate_key, validate_namespace};

use super::Store;
use crate::error::Result;
use crate::index::key_fp;

impl Store {
    /// Pins `key`: until it is unpinned, or `StoreOptions::pin_ttl_secs` after the last pin, a
    /// full volume reclaims other segments before the ones holding it (unless every sealed
    /// segment holds a pin). Returns `false`, pinning nothing, if the key names no live block.
    /// Pins are counted (each needs its own [`Store::unpin`]) and kept in memory only.
    pub fn pin(&self, namespace: &str, key: &str) -> Result<bool> {
        if !self.contains(namespace, key)? {
            return Ok(false);
        }
        let parts = &self.parts;
        let lapses = parts.clock.now_unix_ms().saturating_add(u64::from(parts.opts.pin_ttl_secs) * 1000);
        parts.pins.pin(key_fp(namespace, key), lapses);
        Ok(true)
    }

    /// Releases one pin on `key`; returns whether it held one.
    pub fn unpin(&self, namespace: &str, key: &str) -> Result<bool> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        Ok(self.parts.pins.unpin(&key_fp(namespace, key)))
    }
}
