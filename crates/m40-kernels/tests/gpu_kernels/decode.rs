//! kernels/decode.cu: ops recorded into a decode program and run by the
//! persistent kernel give what the same launches give one by one, in the
//! order they were called, with other launches between them.

use super::*;
use m40_kernels::DecodeProgram;

#[test]
#[ignore = "needs a GPU"]
fn recorded_program_matches_launches() {
    let (dev, _s0, k, mut rng) = setup("recorded_program_matches_launches");
    let s = dev.new_stream().unwrap();
    for ty in [GgmlType::Q4_0, GgmlType::Q6_K] {
        let (n, f) = (512usize, 1280usize);
        let w1 = random_weights(&mut rng, ty, f, n);
        let w2 = random_weights(&mut rng, ty, n, f);
        let p1 = s.upload(&pack_gemv(ty, &w1, f, n).unwrap(), "w1").unwrap();
        let p2 = s.upload(&pack_gemv(ty, &w2, n, f).unwrap(), "w2").unwrap();
        let (v1, v2) = (p1.view(), p2.view());
        let m1 = PackedMatrix {
            ty,
            data: &v1,
            rows: f,
            cols: n,
        };
        let m2 = PackedMatrix {
            ty,
            data: &v2,
            rows: n,
            cols: f,
        };
        let x = s.upload(&rng.vec(n, -1.0, 1.0), "x").unwrap();
        let bias = s.upload(&rng.vec(f, -1.0, 1.0), "bias").unwrap();
        // h = W1 x; h += bias (a launch of its own); y = W2 h.
        let step =
            |k: &Kernels, s: &Stream, h: &mut DeviceBuffer<f32>, y: &mut DeviceBuffer<f32>| {
                k.gemv_packed(s, &m1, &x.view(), h, None)?;
                k.add(s, h, &bias.view(), f)?;
                k.gemv_packed(s, &m2, &h.view(), y, None)?;
                Ok::<_, KernelError>(())
            };
        let mut h = s.upload(&vec![f32::NAN; f], "h").unwrap();
        let mut want = s.upload(&vec![f32::NAN; n], "want").unwrap();
        step(&k, &s, &mut h, &mut want).unwrap();
        let want = s.download(&want).unwrap();

        let mut h = s.upload(&vec![f32::NAN; f], "h").unwrap();
        let mut y = s.upload(&vec![f32::NAN; n], "y").unwrap();
        let mut prog = DecodeProgram::new(&s, 4).unwrap();
        let graph = s
            .capture(|s| k.record_decode(s, &mut prog, || step(&k, s, &mut h, &mut y)))
            .unwrap();
        prog.upload(&s).unwrap();
        for _ in 0..2 {
            // SAFETY: the buffers and the program the graph uses live to the
            // end of this iteration of the loop over formats.
            unsafe { graph.launch().unwrap() };
        }
        let got = s.download(&y).unwrap();
        check(&format!("{ty} decode program"), &got, &want, |i| {
            1e-4 * (1.0 + want[i].abs() as f64)
        });

        // A program without room for its ops is an error, not an overrun.
        let mut small = DecodeProgram::new(&s, 1).unwrap();
        let r = s.capture(|s| k.record_decode(s, &mut small, || step(&k, s, &mut h, &mut y)));
        let e = r
            .err()
            .expect("2 GEMV ops recorded into room for 1")
            .to_string();
        assert!(e.contains("more than the program's 1 ops"), "{ty}: {e}");
    }
}
