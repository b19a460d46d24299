//! Reading a batch of keys into their buffers through the engine's `get_batch_into`, which keeps
//! every read of a batch in flight from one thread.

use kvhoard_engine::{ReadOptions, Store};

use crate::buffers::Region;

/// Reads `keys` into `regions` (one each), `group` keys per engine call (all at once if `None`).
/// Each key's result: the bytes read, `None` for a miss, or what failed. If a call fails as a
/// whole (a device error, one buffer too short), its keys are read again one by one, so each
/// key's result says what happened to it.
///
/// # Safety
///
/// Nobody else may read or write the regions' buffers during the call.
pub(crate) unsafe fn get_all_into(
    engine: &Store,
    namespace: &str,
    keys: &[String],
    regions: &mut [Region],
    group: Option<usize>,
) -> Vec<Result<Option<usize>, String>> {
    let group = group.unwrap_or(keys.len()).max(1);
    let mut results = Vec::with_capacity(keys.len());
    for (keys, regions) in keys.chunks(group).zip(regions.chunks_mut(group)) {
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        // SAFETY: passed on from the caller; each region gives one slice, so none overlap.
        let mut outs: Vec<&mut [u8]> = regions.iter_mut().map(|r| unsafe { r.bytes_mut() }).collect();
        match engine.get_batch_into(namespace, &names, &mut outs, ReadOptions::default()) {
            Ok(got) => results.extend(got.into_iter().map(|g| Ok(g.map(|(_, n)| n)))),
            Err(_) => results.extend(names.iter().zip(outs.iter_mut()).map(|(key, out)| {
                let got = engine.get_into(namespace, key, out, ReadOptions::default());
                got.map(|found| found.map(|(_, n)| n)).map_err(|e| format!("get {key:?}: {e}"))
            })),
        }
    }
    results
}
