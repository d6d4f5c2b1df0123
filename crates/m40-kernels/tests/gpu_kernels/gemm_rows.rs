//! kernels/gemm_rows.cu: the rows tile of every packed format, forced and
//! as the plan takes it.

use super::gemm::{packed_gemm_case, packed_gemm_forced};
use super::*;
use m40_kernels::GemmOpts;

/// The rows tile (kernels/gemm_rows.cuh) of every packed format at 17 and
/// 32 tokens: rows not a multiple of 4 (a padded group), of 128 (a partial
/// strip) or of 512 (a partial block); whole, split over K in 3 (chunks of
/// 4 k-steps: uneven, one split empty) and in 4, the scratch poisoned; and
/// the plan's own choice where it takes the rows tile on this GPU (an 8B's
/// output matrix at 32 tokens).
#[test]
#[ignore = "needs a GPU"]
fn gemm_rows_tile_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("gemm_rows_tile_matches_cpu");
    let most = 4 * 32 * 1030;
    let part = std::cell::RefCell::new(s.alloc::<f32>(most, "scratch").unwrap());
    for f in PackFormat::ALL {
        // 16 k-steps: splits of 3 are chunks of 8, 8 and none.
        let kk = 16 * 32;
        for (m, n) in [(17, 301), (32, 1030)] {
            for splits in [1, 3, 4] {
                let force = (Some(GemmTile::Rows), Some(splits));
                packed_gemm_forced(&s, &k, &mut rng, f.ty, (m, n, kk), Some(&part), force);
            }
        }
    }
    let gpu = k.gemm_slots().unwrap();
    let (n, kk) = (128256, 256);
    let plan = gemm_plan(32, n, 4096, gpu);
    println!(
        "rows slots: {} SMs x {}; an 8B's output matrix at 32 tokens: {plan:?}",
        gpu.sms, gpu.rows_per_sm
    );
    // The same plan at 256 columns (a quicker CPU reference).
    if plan.tile == GemmTile::Rows && gemm_plan(32, n, kk, gpu) == plan {
        packed_gemm_case(&s, &k, &mut rng, GgmlType::Q6_K, (32, n, kk), Some(&part));
    }
    // Past 32 tokens a forced rows tile is an error, not a launch.
    let w = s
        .alloc::<u8>(PackFormat::ALL[0].packed_bytes(8, 64), "w")
        .unwrap();
    let x = s.alloc::<f32>(33 * 64, "x").unwrap();
    let mut y = s.alloc::<f32>(33 * 8, "y").unwrap();
    let pm = PackedMatrix {
        ty: PackFormat::ALL[0].ty,
        data: &w.view(),
        rows: 8,
        cols: 64,
    };
    let opts = GemmOpts {
        tile: Some(GemmTile::Rows),
        ..Default::default()
    };
    assert!(k.gemm_packed(&s, &pm, &x.view(), &mut y, 33, opts).is_err());
}
