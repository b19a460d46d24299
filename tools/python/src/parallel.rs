//! Running one engine call per key of a batch with several keys in flight.
//!
//! One thread reading key after key keeps a single block (or header) in flight, which leaves a
//! fast disk idle between them; a batch is split into up to `depth` groups read at once.

/// The error of a key whose reader thread panicked (a bug; the other keys are still read).
pub(crate) const PANICKED: &str = "a reader thread panicked";

/// `f(key, item)` for every pair, on up to `depth` threads, results in the keys' order. A thread
/// that panics gives `lost()` for each of its keys instead of taking the process down.
pub(crate) fn for_each_key<K, T, R>(
    keys: &[K],
    items: &mut [T],
    depth: usize,
    f: impl Fn(&K, &mut T) -> R + Sync,
    lost: impl Fn() -> R,
) -> Vec<R>
where
    K: Sync,
    T: Send,
    R: Send,
{
    let per_thread = keys.len().div_ceil(depth.max(1)).max(1);
    let group = |keys: &[K], items: &mut [T]| -> Vec<R> { keys.iter().zip(items).map(|(k, i)| f(k, i)).collect() };
    if keys.len() <= per_thread {
        return group(keys, items);
    }
    std::thread::scope(|scope| {
        let groups: Vec<_> = keys
            .chunks(per_thread)
            .zip(items.chunks_mut(per_thread))
            .map(|(k, i)| (k.len(), scope.spawn(|| group(k, i))))
            .collect();
        groups.into_iter().flat_map(|(n, g)| g.join().unwrap_or_else(|_| (0..n).map(|_| lost()).collect())).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::for_each_key;

    #[test]
    fn keeps_the_order_of_the_keys_at_every_depth() {
        let keys: Vec<u32> = (0..37).collect();
        for depth in [0, 1, 2, 3, 8, 64] {
            let mut items = vec![0u32; keys.len()];
            let out = for_each_key(
                &keys,
                &mut items,
                depth,
                |k, i| {
                    *i = k * 2;
                    k + 1
                },
                || 0,
            );
            assert_eq!(out, (1..38).collect::<Vec<_>>(), "depth {depth}");
            assert_eq!(items, keys.iter().map(|k| k * 2).collect::<Vec<_>>(), "depth {depth}");
        }
    }

    #[test]
    fn a_panicking_group_loses_only_its_own_keys() {
        let keys: Vec<u32> = (0..8).collect();
        let mut items = vec![(); keys.len()];
        let out = for_each_key(&keys, &mut items, 4, |k, _| if *k == 5 { panic!("boom") } else { Some(*k) }, || None);
        assert_eq!(out, vec![Some(0), Some(1), Some(2), Some(3), None, None, Some(6), Some(7)]);
    }
}
