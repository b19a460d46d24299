//! The one pseudo-random generator of kvhoard's tests, benchmarks, demo and synthetic data:
//! xoshiro256++ seeded through SplitMix64. Small, fast, and the same on every machine, so that a
//! seed printed by a failing test or a benchmark reproduces exactly. Not for anything secret.

/// A stream of `seed` mixed with `a`, `b` and a stream number: independent streams for, say,
/// every layer and head of a block.
pub fn mix(seed: u64, a: u64, b: u64, stream: u64) -> u64 {
    let mut s = SplitMix(seed ^ 0x6b76_686f_6172_6400);
    s.next();
    let mut x = s.next() ^ a.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = SplitMix(x).next() ^ b.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    SplitMix(x ^ stream).next()
}

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// xoshiro256++.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
    /// The second normal of the last Box-Muller pair, not yet returned.
    spare: Option<f32>,
}

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut s = SplitMix(seed);
        Rng { state: [s.next(), s.next(), s.next(), s.next()], spare: None }
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire's multiply-shift: unbiased enough for tests and benchmarks, no division.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller: one logarithm and one `sin_cos` make two).
    pub fn normal(&mut self) -> f32 {
        if let Some(spare) = self.spare.take() {
            return spare;
        }
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some((r * sin) as f32);
        (r * cos) as f32
    }

    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
    }

    /// Shuffles `items` (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// `len` random bytes from `seed`: the content of test and benchmark blocks.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    Rng::new(seed).fill(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream_and_others_differ() {
        assert_eq!(bytes(7, 100), bytes(7, 100));
        assert_ne!(bytes(7, 100), bytes(8, 100));
        // A shorter stream is a prefix of a longer one.
        assert_eq!(bytes(7, 13)[..], bytes(7, 100)[..13]);
        let mut rng = Rng::new(1);
        let draws: Vec<u64> = (0..1000).map(|_| rng.below(10)).collect();
        assert!(draws.iter().all(|&d| d < 10), "a draw out of range");
        assert!((0..10).all(|v| draws.contains(&v)), "a value never drawn: {draws:?}");
        assert_eq!(Rng::new(3).below(0), 0);
    }

    #[test]
    fn shuffles_are_permutations() {
        let mut items: Vec<u32> = (0..100).collect();
        Rng::new(5).shuffle(&mut items);
        assert_ne!(items, (0..100).collect::<Vec<_>>());
        items.sort_unstable();
        assert_eq!(items, (0..100).collect::<Vec<_>>());
    }
}
