//! Helpers of the GPU kernel tests: fresh random inputs (the seed is printed;
//! `M40_SEED` repeats a run), random weights of every format, and a checker
//! that reports the first mismatches and the largest difference.
#![allow(dead_code)]

use m40_gguf::GgmlType;

/// SplitMix64: small, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `M40_SEED` or the clock; prints the seed so a failure can be repeated.
    pub fn fresh(test: &str) -> Self {
        let seed = std::env::var("M40_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("{test}: M40_SEED={seed}");
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// 0..n in a random order (a shuffled choice of KV pages).
    pub fn shuffled(&mut self, n: usize) -> Vec<i32> {
        let mut ids: Vec<i32> = (0..n as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, self.below(i + 1));
        }
        ids
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A random FP16 scale: magnitude in [1e-3, 3e-2), either sign.
    fn scale_bits(&mut self) -> [u8; 2] {
        let m = self.uniform(1e-3, 3e-2);
        let v = if self.next_u64() & 1 == 0 { m } else { -m };
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }
}

/// Byte offsets of the FP16 scale fields in a block of `ty`.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` x `ncols` random weights in `ty`: random bytes for the quantized
/// formats (every bit pattern of the quants occurs) with finite random scales;
/// random values for the float formats.
pub fn random_weights(rng: &mut Rng, ty: GgmlType, rows: usize, ncols: usize) -> Vec<u8> {
    let n = rows * ncols;
    match ty {
        GgmlType::F32 => bytemuck::cast_slice(&rng.vec(n, -1.0, 1.0)).to_vec(),
        GgmlType::F16 => rng
            .vec(n, -1.0, 1.0)
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        GgmlType::BF16 => rng
            .vec(n, -1.0, 1.0)
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let bb = ty.block_bytes();
            let mut b = rng.bytes(n / ty.block_len() * bb);
            for block in b.chunks_exact_mut(bb) {
                for &o in scale_offsets(ty) {
                    block[o..o + 2].copy_from_slice(&rng.scale_bits());
                }
                // MXFP4's E8M0 exponent: scales 2^-10 .. 2^-4, and now and
                // then the two denormal ones (e = 0, 1).
                if ty == GgmlType::MXFP4 {
                    block[0] = match rng.below(32) {
                        0 => rng.below(2) as u8,
                        _ => 118 + rng.below(7) as u8,
                    };
                }
            }
            b
        }
    }
}

/// The CPU dequantization (the reference) of `rows` x `ncols` weights.
pub fn dequant(ty: GgmlType, w: &[u8], rows: usize, ncols: usize) -> Vec<f32> {
    let mut out = vec![0.0; rows * ncols];
    m40_gguf::quant::dequantize(ty, w, &mut out).expect("reference dequantization");
    out
}

/// Compare every element: |gpu - cpu| <= tol[i]. Prints the first mismatches
/// and the largest difference; panics if any element fails (NaN fails).
pub fn check(what: &str, gpu: &[f32], cpu: &[f32], tol: impl Fn(usize) -> f64) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let mut bad = 0;
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &c)) in gpu.iter().zip(cpu).enumerate() {
        let d = (g as f64 - c as f64).abs();
        let ok = d <= tol(i); // false for NaN
        if !ok {
            if bad < 8 {
                eprintln!("{what}: [{i}] gpu {g} cpu {c} diff {d:e} tol {:e}", tol(i));
            }
            bad += 1;
        }
        if d.is_nan() || d > worst.0 {
            worst = (if d.is_nan() { f64::INFINITY } else { d }, i);
        }
    }
    assert!(
        bad == 0,
        "{what}: {bad} of {} elements differ (largest difference {:e} at {})",
        gpu.len(),
        worst.0,
        worst.1
    );
}

/// Disjoint shuffled pages of one pool for sequences of `keys[s]` tokens,
/// with `spare` pages more: each sequence's block table, the tables one
/// after another, where each starts in that list, and the pool's pages.
pub fn batch_tables(
    rng: &mut Rng,
    keys: &[usize],
    spare: usize,
) -> (Vec<Vec<i32>>, Vec<i32>, Vec<i32>, usize) {
    use m40_kernels::KV_PAGE;
    let need: usize = keys.iter().map(|k| k.div_ceil(KV_PAGE)).sum();
    let pool_pages = need + spare;
    let ids = rng.shuffled(pool_pages);
    let (mut tables, mut tab) = (Vec::new(), Vec::new());
    let mut next = 0;
    for k in keys {
        let n = k.div_ceil(KV_PAGE);
        tab.push(next as i32);
        tables.push(ids[next..next + n].to_vec());
        next += n;
    }
    let all = ids[..next].to_vec();
    (tables, all, tab, pool_pages)
}

/// Keys `k` and values `v` (tokens of `kv_dim`) in FP16 at their pages and
/// slots of the pools `kp` and `vp` under block table `table`.
pub fn write_kv(
    kp: &mut [u16],
    vp: &mut [u16],
    table: &[i32],
    k: &[f32],
    v: &[f32],
    kv_dim: usize,
) {
    use m40_kernels::KV_PAGE;
    for j in 0..k.len() / kv_dim {
        let at = (table[j / KV_PAGE] as usize * KV_PAGE + j % KV_PAGE) * kv_dim;
        for c in 0..kv_dim {
            kp[at + c] = half::f16::from_f32(k[j * kv_dim + c]).to_bits();
            vp[at + c] = half::f16::from_f32(v[j * kv_dim + c]).to_bits();
        }
    }
}
