//! kernels/gemv.cu: the GEMV of every GGUF format, every split.

use super::*;

/// (rows, cols) for a format: tiny, a partial chunk, 4 warps + 3, the decode
/// shape 4096 x 4096 with rows not a multiple of the warps per block, and
/// 9001 short rows (several rows per warp, an uneven last round).
fn gemv_shapes(f: &KernelFormat) -> Vec<(usize, usize)> {
    if f.float {
        vec![
            (1, 1),
            (3, 33),
            (7, 1001),
            (131, 4097),
            (4099, 4096),
            (9001, 65),
        ]
    } else if f.qk == 256 {
        vec![
            (1, 256),
            (5, 768),
            (19, 9 * 256),
            (131, 4096),
            (4099, 4096),
            (9001, 512),
        ]
    } else {
        vec![
            (1, 32),
            (5, 96),
            (19, 65 * 32),
            (131, 4096),
            (4099, 4096),
            (9001, 64),
        ]
    }
}

/// W x in f64 from the CPU dequantization of W, and per row sum |w_i x_i|
/// (the scale of the rounding error a correct FP32 kernel may make).
fn gemv_reference(
    ty: GgmlType,
    w: &[u8],
    x: &[f32],
    rows: usize,
    cols: usize,
) -> (Vec<f32>, Vec<f64>) {
    dequant(ty, w, rows, cols)
        .chunks_exact(cols)
        .map(|r| {
            let dot: f64 = r.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let mag: f64 = r
                .iter()
                .zip(x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            (dot as f32, mag)
        })
        .unzip()
}

/// Runs `launch` (weights `upload`: `w` in the layout the launcher reads)
/// with the launcher's own split (None) and 1, 2 and 4 warps per row group
/// forced, y poisoned before each, and checks every output against the CPU
/// reference of `w`; `launch` returns what it launched, for messages.
pub(crate) fn check_every_split(
    s: &Stream,
    ty: GgmlType,
    w: &[u8],
    upload: &[u8],
    x: &[f32],
    rows: usize,
    mut launch: impl FnMut(
        &DeviceView<'_, u8>,
        &DeviceView<'_, f32>,
        &mut DeviceBuffer<f32>,
        Option<u32>,
    ) -> String,
) {
    let cols = x.len();
    let (want, mag) = gemv_reference(ty, w, x, rows, cols);
    let wg = s.upload(upload, "weights").unwrap();
    let xg = s.upload(x, "x").unwrap();
    let mut y = s.alloc::<f32>(rows, "y").unwrap();
    for ksplit in [None, Some(1), Some(2), Some(3), Some(4)] {
        s.fill_bytes(&mut y, 0xFF).unwrap();
        let what = launch(&wg.view(), &xg.view(), &mut y, ksplit);
        let got = s.download(&y).unwrap();
        check(&what, &got, &want, |i| 1e-5 * mag[i] + 1e-30);
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gemv_every_format_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("gemv_every_format_matches_cpu");
    for f in KernelFormat::ALL {
        for (rows, cols) in gemv_shapes(&f) {
            let w = random_weights(&mut rng, f.ty, rows, cols);
            let x = rng.vec(cols, -1.0, 1.0);
            // The launcher's own plan, then each split of a row's chunks over
            // 1, 2, 3 and 4 warps (lowered where a row has fewer chunks, and
            // 3 to 2 where the kernel has no 3-way split).
            check_every_split(&s, f.ty, &w, &w, &x, rows, |wv, xv, y, ksplit| {
                let m = QMatrix {
                    ty: f.ty,
                    data: wv,
                    rows,
                    cols,
                };
                let plan = k.gemv_split(&s, &m, xv, y, ksplit).unwrap();
                format!("gemv {} {rows}x{cols} {plan:?}", f.ty)
            });
        }
    }
}
