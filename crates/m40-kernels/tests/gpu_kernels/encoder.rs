//! kernels/encoder.cu: an encoder's attention over every key of each
//! token's sequence (paged FP16 pools, several sequences a step), and the
//! ungated GELU.

use super::common::{batch_tables, write_kv};
use super::*;
use m40_kernels::{EncAttnInputs, EncHeads, KV_PAGE};

/// softmax(scale q k^T) v for each query head of each token over all of
/// its sequence's keys (k, v: the sequence's rows of kv_dim, FP16-rounded
/// as the pools hold them).
fn reference(q: &[f32], k: &[f32], v: &[f32], len: usize, h: EncHeads) -> Vec<f32> {
    let (hd, nh) = (h.head_dim, h.n_head);
    let kv_dim = h.n_head_kv * hd;
    let group = nh / h.n_head_kv;
    let r16 = |x: f32| half::f16::from_f32(x).to_f32();
    let mut out = vec![0f32; len * nh * hd];
    for t in 0..len {
        for hh in 0..nh {
            let g = hh / group;
            let qh = &q[(t * nh + hh) * hd..][..hd];
            let mut s: Vec<f64> = (0..len)
                .map(|j| {
                    let kj = &k[j * kv_dim + g * hd..][..hd];
                    qh.iter()
                        .zip(kj)
                        .map(|(a, b)| (a * h.scale) as f64 * r16(*b) as f64)
                        .sum()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            s.iter_mut().for_each(|x| *x = (*x - m).exp());
            let sum: f64 = s.iter().sum();
            for d in 0..hd {
                let acc: f64 = (0..len)
                    .map(|j| s[j] * r16(v[j * kv_dim + g * hd + d]) as f64)
                    .sum();
                out[(t * nh + hh) * hd + d] = (acc / sum) as f32;
            }
        }
    }
    out
}

#[test]
#[ignore = "needs a GPU"]
fn encoder_attention_sees_every_key_of_its_sequence() {
    let (_dev, s, k, mut rng) = setup("encoder_attention_sees_every_key_of_its_sequence");
    // (sequence lengths, heads, KV heads, head dim): all-minilm's 12 x 32,
    // bge's 16 x 64, a GQA shape, one long sequence past a page and the
    // 2048-key limit's neighbourhood.
    for (lens, nh, nkv, hd) in [
        (vec![1usize, 7, 33, 5], 12, 12, 32),
        (vec![64, 3], 16, 16, 64),
        (vec![40, 17, 2], 8, 2, 128),
        (vec![300], 4, 4, 256),
        (vec![1500], 2, 1, 64),
    ] {
        let h = EncHeads {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        let kv_dim = nkv * hd;
        let n: usize = lens.iter().sum();
        let (tables, all, tab_s, pool_pages) = batch_tables(&mut rng, &lens, 2);
        let mut kp = vec![0xFFFFu16; pool_pages * KV_PAGE * kv_dim];
        let mut vp = kp.clone();
        let q = rng.vec(n * nh * hd, -1.0, 1.0);
        let (mut want, mut pos, mut tab) = (Vec::new(), Vec::new(), Vec::new());
        let mut row = 0;
        for (i, &len) in lens.iter().enumerate() {
            let kk = rng.vec(len * kv_dim, -1.0, 1.0);
            let vv = rng.vec(len * kv_dim, -1.0, 1.0);
            write_kv(&mut kp, &mut vp, &tables[i], &kk, &vv, kv_dim);
            want.extend(reference(
                &q[row * nh * hd..][..len * nh * hd],
                &kk,
                &vv,
                len,
                h,
            ));
            pos.extend((0..len as i32).collect::<Vec<_>>());
            tab.extend(std::iter::repeat_n(tab_s[i], len));
            row += len;
        }
        let (kg, vg) = (s.upload(&kp, "k").unwrap(), s.upload(&vp, "v").unwrap());
        let (tg, tabg) = (
            s.upload(&all, "table").unwrap(),
            s.upload(&tab, "tab").unwrap(),
        );
        let (qg, pg) = (s.upload(&q, "q").unwrap(), s.upload(&pos, "pos").unwrap());
        let mut out = s.upload(&vec![f32::NAN; n * nh * hd], "out").unwrap();
        let inputs = EncAttnInputs {
            q: &qg.view(),
            kpool: &kg.view(),
            vpool: &vg.view(),
            table: &tg.view(),
            tab: &tabg.view(),
            pos: &pg.view(),
        };
        k.attention_encoder(&s, h, &inputs, n, &mut out).unwrap();
        check(
            &format!("encoder attention {lens:?} {nh}/{nkv} x {hd}"),
            &s.download(&out).unwrap(),
            &want,
            |i| 2e-5 * want[i].abs().max(1.0) as f64,
        );
    }
    // A head dimension past the shared queries, and heads that do not
    // divide, are refused.
    let z = s.upload(&[0f32; 4 * 512], "z").unwrap();
    let zi = s.upload(&[0i32; 4], "zi").unwrap();
    let zh = s.upload(&vec![0u16; KV_PAGE * 512], "zh").unwrap();
    let mut o = s.alloc::<f32>(4 * 512, "o").unwrap();
    let inputs = EncAttnInputs {
        q: &z.view(),
        kpool: &zh.view(),
        vpool: &zh.view(),
        table: &zi.view(),
        tab: &zi.view(),
        pos: &zi.view(),
    };
    for (nh, nkv, hd) in [(1, 1, 512), (3, 2, 64)] {
        let h = EncHeads {
            n_head: nh,
            n_head_kv: nkv,
            head_dim: hd,
            scale: 1.0,
        };
        assert!(k.attention_encoder(&s, h, &inputs, 1, &mut o).is_err());
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gelu_matches_cpu() {
    let (_dev, s, k, mut rng) = setup("gelu_matches_cpu");
    for n in [1, 127, 128 * 700 + 5] {
        let x = rng.vec(n, -8.0, 8.0);
        let want: Vec<f32> = x.iter().map(|&v| ops::gelu_tanh(v)).collect();
        let mut g = s.upload(&x, "x").unwrap();
        k.gelu(&s, &mut g, n).unwrap();
        check(&format!("gelu {n}"), &s.download(&g).unwrap(), &want, |i| {
            1e-5 * want[i].abs() as f64 + 2e-6
        });
    }
}
