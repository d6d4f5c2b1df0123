//! Every kernel against its CPU reference on fresh random inputs, outputs
//! poisoned (all bytes 0xFF: NaN) before the launch, every element checked,
//! sizes that are not multiples of the block sizes. One module per
//! `kernels/*.cu` (as m40-kernels has one per launcher file). Every test
//! needs a GPU: without `--include-ignored` the harness lists them as
//! ignored; with it and no GPU they fail.

mod common;

mod attention;
mod bench;
mod decode;
mod elementwise;
mod embed;
mod encoder;
mod gemm;
mod gemm_rows;
mod gemv;
mod gemv_packed;
mod moe;
mod rmsnorm;
mod rope;
mod sample;

use std::sync::Arc;

use common::{check, dequant, random_weights, Rng};
use m40_device::testing::gpu_device;
use m40_device::{Device, DeviceBuffer, DeviceView, Stream};
use m40_gguf::GgmlType;
use m40_kernels::{
    gemm_large_tiles, gemm_plan, gemm_scratch_len, interleave_glu, pack_gemv, select_args, Fold,
    GemmTile, GemvOut, KernelError, KernelFormat, Kernels, PackFormat, PackedMatrix, Penalties,
    QMatrix, RopeParams, RopeStyle, RowSplit, PACKED_GEMV_MAX_TOKENS, SELECT_ARGS, SELECT_MAX_K,
    SELECT_SCRATCH,
};
use m40_model::cpu::ops;

/// The device, a stream, its kernels and a fresh seed for `test`.
fn setup(test: &str) -> (Arc<Device>, Stream, Kernels, Rng) {
    let dev = gpu_device(test);
    let stream = dev.stream();
    let k = Kernels::new(dev.clone());
    (dev, stream, k, Rng::fresh(test))
}

#[test]
#[ignore = "needs a GPU"]
fn launchers_refuse_bad_shapes() {
    let (_dev, s, k, _rng) = setup("launchers_refuse_bad_shapes");
    let w = s.upload(&[0u8; 18 * 4], "w").unwrap();
    let wv = w.view();
    let x = s.upload(&[0f32; 64], "x").unwrap();
    let mut y = s.alloc::<f32>(8, "y").unwrap();
    let m = |ty, rows, cols| QMatrix {
        ty,
        data: &wv,
        rows,
        cols,
    };
    let shape_err = |r: m40_kernels::Result<()>| matches!(r, Err(KernelError::Shape { .. }));
    // 4 rows of 32 Q4_0 fit in 72 bytes; 5 rows do not.
    k.gemv(&s, &m(GgmlType::Q4_0, 4, 32), &x.view(), &mut y)
        .unwrap();
    assert!(shape_err(k.gemv(
        &s,
        &m(GgmlType::Q4_0, 5, 32),
        &x.view(),
        &mut y
    )));
    // Not a whole number of K-quant blocks.
    assert!(shape_err(k.gemv(
        &s,
        &m(GgmlType::Q4_K, 1, 100),
        &x.view(),
        &mut y
    )));
    // Misaligned x.
    let xv = x.slice(1..64).unwrap();
    assert!(shape_err(k.gemv(&s, &m(GgmlType::F32, 1, 8), &xv, &mut y)));
    // y too short.
    assert!(shape_err(k.gemv(
        &s,
        &m(GgmlType::F32, 9, 2),
        &x.view(),
        &mut y
    )));
    // No kernel for this format.
    let r = k.gemv(&s, &m(GgmlType::Q8_K, 1, 256), &x.view(), &mut y);
    assert!(matches!(r, Err(KernelError::Unsupported { .. })));
    s.synchronize().unwrap();
}

/// A kernel reads mapped (zero-copy) host memory directly and writes another
/// mapped buffer the host then reads: the path the decode ring buffers take.
#[test]
#[ignore = "needs a GPU"]
fn kernels_read_and_write_mapped_host_memory() {
    let (_dev, s, k, mut rng) = setup("kernels_read_and_write_mapped_host_memory");
    let n = 100_003usize;
    let x = rng.vec(n, -1.0, 1.0);
    let y0 = rng.vec(n, -1.0, 1.0);
    let mut mx = s.alloc_mapped::<f32>(n, "mapped x").unwrap();
    mx.as_mut_slice().unwrap().copy_from_slice(&x);
    let mut y = s.upload(&y0, "y").unwrap();
    let add = k.kernel("elementwise", "add_f32").unwrap();
    let n64 = n as i64;
    let cfg = m40_device::LaunchConfig {
        grid: (n.div_ceil(256) as u32, 1, 1),
        block: (256, 1, 1),
        shared_bytes: 0,
    };
    // SAFETY: add_f32(float* y, const float* x, long long n): y has n floats on
    // the device, x is a mapped host buffer of n floats.
    unsafe {
        s.launch(&add)
            .buf_mut(&mut y)
            .mapped(&mx)
            .scalar(&n64)
            .run(cfg)
            .unwrap()
    };
    let want: Vec<f32> = x.iter().zip(&y0).map(|(a, b)| a + b).collect();
    check("add from mapped x", &s.download(&y).unwrap(), &want, |_| {
        0.0
    });

    // Now the output is mapped: the kernel writes host memory.
    let mut my = s.alloc_mapped::<f32>(n, "mapped y").unwrap();
    my.as_mut_slice().unwrap().copy_from_slice(&y0);
    let xg = s.upload(&x, "x").unwrap();
    let xv = xg.view();
    // SAFETY: as above, with y a mapped host buffer of n floats.
    unsafe {
        s.launch(&add)
            .mapped(&my)
            .view(&xv)
            .scalar(&n64)
            .run(cfg)
            .unwrap()
    };
    s.synchronize().unwrap();
    check("add into mapped y", my.as_slice().unwrap(), &want, |_| 0.0);
}

/// Kernels captured into a graph on a second stream replay with the buffers
/// they were captured with; the default stream refuses capture.
#[test]
#[ignore = "needs a GPU"]
fn graph_capture_replays_kernels() {
    let (dev, s0, k, mut rng) = setup("graph_capture_replays_kernels");
    let n = 10_007usize;
    let x = rng.vec(n, -1.0, 1.0);
    let u = rng.vec(n, -2.0, 2.0);
    let s = dev.new_stream().unwrap();
    let xg = s.upload(&x, "x").unwrap();
    let ug = s.upload(&u, "u").unwrap();
    let mut y = s.upload(&x, "y").unwrap();
    // One replay: y += x, then y = silu(y) * u.
    let graph = s
        .capture(|s| {
            k.add(s, &mut y, &xg.view(), n)?;
            k.swiglu(s, &mut y, &ug.view(), n)
        })
        .unwrap();
    for _ in 0..3 {
        // SAFETY: x, u and y, which the graph uses, live to the end of the test.
        unsafe { graph.launch().unwrap() };
    }
    let mut want = x.clone();
    for _ in 0..3 {
        for (w, xv) in want.iter_mut().zip(&x) {
            *w += xv;
        }
        ops::swiglu(&mut want, &u);
    }
    let got = s.download(&y).unwrap();
    check("graph replays", &got, &want, |i| {
        1e-5 * want[i].abs() as f64 + 1e-6
    });
    let refused = s0.capture(|s| k.add(s, &mut y, &xg.view(), n));
    assert!(matches!(
        refused,
        Err(KernelError::Device(m40_device::DeviceError::Capture(_)))
    ));
}
