//! Dot products with runtime CPU dispatch: AVX2+FMA where the CPU has it (the
//! binary itself targets baseline x86-64), a portable 8-lane loop otherwise.

/// `sum(a[i] * b[i])`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_portable(a, b)
}

/// Four dot products of one row `w` with four vectors, reading `w` once.
#[inline]
pub fn dot4(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { dot4_avx2(w, x) };
        }
    }
    [
        dot_portable(w, x[0]),
        dot_portable(w, x[1]),
        dot_portable(w, x[2]),
        dot_portable(w, x[3]),
    ]
}

/// One dot product by the arithmetic of one lane of [`dot4`] (bitwise the
/// same result as that lane).
#[inline]
pub fn dot1(w: &[f32], x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { dot1_avx2(w, x) };
        }
    }
    dot_portable(w, x)
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for k in 0..8 {
            acc[k] += ca[k] * cb[k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in n8..a.len() {
        s += a[i] * b[i];
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU must support AVX2 and FMA.
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let n16 = n / 16 * 16;
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i < n16 {
        // SAFETY: i + 16 <= n, within both slices.
        unsafe {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
        }
        i += 16;
    }
    let mut s = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        s += a[i] * b[i];
        i += 1;
    }
    s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU must support AVX2 and FMA.
unsafe fn dot4_avx2(w: &[f32], x: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let n = x.iter().fold(w.len(), |m, v| m.min(v.len()));
    let n8 = n / 8 * 8;
    let pw = w.as_ptr();
    let px = [x[0].as_ptr(), x[1].as_ptr(), x[2].as_ptr(), x[3].as_ptr()];
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n, within every slice.
        unsafe {
            let wv = _mm256_loadu_ps(pw.add(i));
            for k in 0..4 {
                acc[k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(px[k].add(i)), acc[k]);
            }
        }
        i += 8;
    }
    let mut out = [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])];
    while i < n {
        for k in 0..4 {
            out[k] += w[i] * x[k][i];
        }
        i += 1;
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU must support AVX2 and FMA.
unsafe fn dot1_avx2(w: &[f32], x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = w.len().min(x.len());
    let n8 = n / 8 * 8;
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < n8 {
        // SAFETY: i + 8 <= n, within both slices.
        unsafe {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(pw.add(i)), _mm256_loadu_ps(px.add(i)), acc);
        }
        i += 8;
    }
    let mut out = hsum(acc);
    while i < n {
        out += w[i] * x[i];
        i += 1;
    }
    out
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// Whether this CPU has what the AVX2 code of `q8.rs`, `q4x8.rs`,
/// `q8k.rs` and `fused.rs` uses (AVX2, FMA, F16C).
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_matches_portable() {
        let a: Vec<f32> = (0..1037)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..1037)
            .map(|i| ((i * 53) % 97) as f32 / 40.0 - 1.2)
            .collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-3);
        let four = dot4(&a, [&b, &a, &b, &a]);
        assert!((four[0] as f64 - want).abs() < 1e-3);
        assert!((four[1] - dot_portable(&a, &a)).abs() < 1e-3);
    }
}
