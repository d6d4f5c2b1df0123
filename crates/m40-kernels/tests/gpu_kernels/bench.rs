//! kernels/bench.cu: the probes the benchmarks measure ceilings with
//! compute what their CPU mirrors do, so a ceiling is work really done.

use super::*;

/// fill_random's word `i` for `seed`.
fn hash(i: u64, seed: u32) -> u32 {
    let mut x =
        (i as u32).wrapping_mul(0x9E37_79B1) ^ seed ^ ((i >> 32) as u32).wrapping_mul(0x85EB_CA77);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^ (x >> 16)
}

#[test]
#[ignore = "needs a GPU"]
fn probes_match_cpu() {
    let (_dev, s, k, mut rng) = setup("probes_match_cpu");
    for bytes in [0usize, 3, 4, 64, 1 << 20 | 6] {
        let seed = rng.next_u64() as u32;
        let mut buf = s.upload(&vec![0xA5u8; bytes], "buf").unwrap();
        k.fill_random(&s, &mut buf, seed).unwrap();
        let got = s.download(&buf).unwrap();
        let words = bytes / 4;
        for i in 0..words {
            let w = u32::from_le_bytes(got[4 * i..4 * i + 4].try_into().unwrap());
            assert_eq!(
                w,
                hash(i as u64, seed),
                "fill_random word {i} of {bytes} bytes"
            );
        }
        assert!(
            got[4 * words..].iter().all(|&b| b == 0xA5),
            "a partial word is left alone"
        );
    }

    // read_probe: the blocks' words XOR to the XOR of every 16-byte vector.
    let blocks = k.probe_blocks();
    for bytes in [16usize, 4096, (3 << 20) + 48] {
        let data = rng.bytes(bytes);
        let buf = s.upload(&data, "buf").unwrap();
        let mut out = s.upload(&vec![0xFFFF_FFFFu32; blocks], "out").unwrap();
        k.read_probe(&s, &buf.view(), &mut out).unwrap();
        let got = s.download(&out).unwrap().iter().fold(0, |a, w| a ^ w);
        let want = data
            .chunks_exact(4)
            .fold(0u32, |a, w| a ^ u32::from_le_bytes(w.try_into().unwrap()));
        assert_eq!(got, want, "read_probe over {bytes} bytes");
    }

    // fma_probe: each thread's 8 chains of fused multiply-adds, summed.
    let threads = blocks * 256;
    let mut out = s.upload(&vec![f32::NAN; threads], "out").unwrap();
    let iters = 37;
    let flops = k.fma_probe(&s, &mut out, iters).unwrap();
    assert_eq!(flops, 2 * 8 * iters as u64 * threads as u64);
    let got = s.download(&out).unwrap();
    for (i, g) in got.iter().enumerate() {
        let t = (i % 256) as f32;
        let want: f32 = (0..8)
            .map(|j| (0..iters).fold(t + j as f32, |x, _| x.mul_add(0.999, 0.5)))
            .sum();
        assert_eq!(g.to_bits(), want.to_bits(), "fma_probe thread {i}");
    }
}
