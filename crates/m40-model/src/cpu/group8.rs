//! What the repacked 8-bit products ([`super::q4x8`], [`super::kx8`])
//! share: rows in groups of eight (a 32-bit lane each), each token's eight
//! sums handed out, and the product's driver: rayon tasks of a few groups,
//! each group's tokens a pass at a time, the transposed result put back.

use rayon::prelude::*;

/// Rows interleaved together.
pub const GROUP: usize = 8;

/// Per token, a group's eight row sums.
pub type Sums<const N: usize> = [[f32; GROUP]; N];

/// How a pass hands out a token's sums: `put(token - t0, first row of the
/// pass's groups, sums)`.
pub type Put<'a> = &'a mut dyn FnMut(usize, usize, &[f32]);

/// Each token's row sums (from row `row0` of the pass's groups) handed to
/// `put`; returns `N`.
pub fn emit<const N: usize, const R: usize>(s: [[f32; R]; N], row0: usize, put: Put<'_>) -> usize {
    for (t, rows) in s.iter().enumerate() {
        put(t, row0, rows);
    }
    N
}

/// A pass over each of `g`'s groups (`gb` bytes each) in turn, for the
/// same tokens: `pass(group, put)` does one group (rows from 0) and
/// returns how many tokens it did; the groups' rows go to `put` 8 apart.
pub fn each_group(
    g: &[u8],
    gb: usize,
    put: Put<'_>,
    mut pass: impl FnMut(&[u8], Put<'_>) -> usize,
) -> usize {
    let mut n = 0;
    for (i, one) in g.chunks(gb).enumerate() {
        n = pass(one, &mut |t, r0, sums| put(t, r0 + i * GROUP, sums));
    }
    n
}

/// Eight sums a vector (lane r: row r) as floats.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn store<const N: usize>(acc: [std::arch::x86_64::__m256; N]) -> Sums<N> {
    acc.map(|v| {
        let mut o = [0f32; GROUP];
        // SAFETY: o holds 8 floats; the callers run with AVX2.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(o.as_mut_ptr(), v) };
        o
    })
}

/// `out[t * n_out + r]` for `n_tok` tokens and a matrix repacked in groups
/// of eight rows of `group_bytes` each, `task_groups` groups a rayon task,
/// `pass_groups` (or the task's last fewer) a pass: `pass(groups, t0,
/// left, put)` computes their sums for the next tokens from `t0` (at most
/// `left`), hands them to `put` and returns how many tokens it did.
pub fn matmul_groups<P>(
    data: &[u8],
    (group_bytes, task_groups, pass_groups): (usize, usize, usize),
    n_tok: usize,
    out: &mut [f32],
    pass: P,
) where
    P: Fn(&[u8], usize, usize, Put<'_>) -> usize + Sync,
{
    let n_out = data.len() / group_bytes * GROUP;
    assert_eq!(out.len(), n_tok * n_out, "matmul output shape");
    let mut out_t = vec![0f32; n_tok * n_out];
    out_t
        .par_chunks_mut(task_groups * GROUP * n_tok)
        .zip(data.par_chunks(task_groups * group_bytes))
        .for_each(|(dst, groups)| {
            let pairs = groups
                .chunks(pass_groups * group_bytes)
                .zip(dst.chunks_mut(pass_groups * GROUP * n_tok));
            for (g, dst) in pairs {
                let mut t0 = 0;
                while t0 < n_tok {
                    let mut put = |t: usize, row0: usize, sums: &[f32]| {
                        for (r, s) in sums.iter().enumerate() {
                            dst[(row0 + r) * n_tok + t0 + t] = *s;
                        }
                    };
                    t0 += pass(g, t0, n_tok - t0, &mut put);
                }
            }
        });
    super::matmul::untranspose(&out_t, n_tok, n_out, out);
}

/// A repacked product (`got(x, n_tok, out)`) against its reference (`want`,
/// the unpacked 8-bit product) on `x` (9 tokens of `cols`) by weights `w`
/// (`rows` x `cols`, as quantized): every output within 1e-5 of the row's
/// absolute sum of the reference's, poisoned first, for 1 to 9 tokens a
/// call; and each token's outputs the same bits whatever number of tokens
/// share the call (batch invariance).
#[cfg(test)]
pub fn check_repacked(
    what: &str,
    (rows, cols): (usize, usize),
    w: &[f32],
    x: &[f32],
    got: impl Fn(&[f32], usize, &mut [f32]),
    want: impl Fn(&[f32], usize, &mut [f32]),
) {
    let alone: Vec<Vec<f32>> = (0..9)
        .map(|t| {
            let mut o = vec![f32::NAN; rows];
            got(&x[t * cols..(t + 1) * cols], 1, &mut o);
            o
        })
        .collect();
    for n_tok in [1usize, 2, 3, 4, 5, 9] {
        let xs = &x[..n_tok * cols];
        let mut g = vec![f32::NAN; n_tok * rows];
        got(xs, n_tok, &mut g);
        let mut e = vec![f32::NAN; n_tok * rows];
        want(xs, n_tok, &mut e);
        for t in 0..n_tok {
            for r in 0..rows {
                let (gv, ev) = (g[t * rows + r], e[t * rows + r]);
                let norm: f32 = (0..cols)
                    .map(|c| (w[r * cols + c] * xs[t * cols + c]).abs())
                    .sum();
                assert!(
                    (gv - ev).abs() <= 1e-5 * norm + 1e-6,
                    "{what} n_tok {n_tok}, token {t}, row {r}: {gv} vs {ev}"
                );
                assert_eq!(
                    gv.to_bits(),
                    alone[t][r].to_bits(),
                    "{what} n_tok {n_tok}, token {t}, row {r}: not the token's result alone"
                );
            }
        }
    }
}
