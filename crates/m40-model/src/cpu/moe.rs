//! The mixture-of-experts FFN of the CPU backend (qwen3moe, Mixtral,
//! gpt-oss).

use m40_gguf::hparams::LayerNames;

use super::ops::{add_rows, glu, softmax};
use super::CpuBackend;
use crate::error::Result;

impl CpuBackend {
    /// The mixture-of-experts FFN of layer `names` for the `n` rows of h
    /// into `out` (n, n_embd): each token's experts as [`route`] picks
    /// them, every expert's tokens through its matrices together, and
    /// each token's outputs summed in the order of its experts (the same
    /// arithmetic whatever else the step holds).
    /// gpt-oss's biases (`bias`: router, gate, up, down) are added to
    /// each product.
    pub(super) fn moe_ffn(
        &self,
        names: &LayerNames,
        bias: Option<&[Vec<f32>; 4]>,
        h: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture");
        let (d, k, ff) = (hp.n_embd, m.n_expert_used, m.n_ff_exp);
        let mut logits = vec![0f32; n * m.n_expert];
        self.matmul(&names.ffn_gate_inp, h, n, &mut logits)?;
        if let Some([b, ..]) = bias {
            add_rows(&mut logits, b);
        }
        let routes: Vec<Vec<(usize, f32)>> = logits
            .chunks_exact(m.n_expert)
            .map(|l| route(l, k))
            .collect();
        let [gw, uw, dw] = [
            &names.ffn_gate_exps,
            &names.ffn_up_exps,
            &names.ffn_down_exps,
        ]
        .map(|name| self.model.tensor(name));
        // Every (token, slot)'s expert output, (n, k, d).
        let mut slots = vec![0f32; n * k * d];
        for e in 0..m.n_expert {
            let mine: Vec<(usize, usize)> = (0..n)
                .flat_map(|t| {
                    let r = &routes[t];
                    (0..k).filter(move |&j| r[j].0 == e).map(move |j| (t, j))
                })
                .collect();
            if mine.is_empty() {
                continue;
            }
            let ne = mine.len();
            let xs: Vec<f32> = mine
                .iter()
                .flat_map(|&(t, _)| h[t * d..(t + 1) * d].iter().copied())
                .collect();
            let (gi, ui, di) = (gw.info.matrix(e), uw.info.matrix(e), dw.info.matrix(e));
            let (mut g, mut u) = (vec![0f32; ne * ff], vec![0f32; ne * ff]);
            self.matmul_view(&gw.matrix(&gi, e), &xs, ne, &mut g)?;
            self.matmul_view(&uw.matrix(&ui, e), &xs, ne, &mut u)?;
            if let Some([_, gb, ub, _]) = bias {
                add_rows(&mut g, &gb[e * ff..(e + 1) * ff]);
                add_rows(&mut u, &ub[e * ff..(e + 1) * ff]);
            }
            glu(hp.act, &mut g, &u);
            let mut y = vec![0f32; ne * d];
            self.matmul_view(&dw.matrix(&di, e), &g, ne, &mut y)?;
            if let Some([.., db]) = bias {
                add_rows(&mut y, &db[e * d..(e + 1) * d]);
            }
            for (i, &(t, j)) in mine.iter().enumerate() {
                slots[(t * k + j) * d..][..d].copy_from_slice(&y[i * d..(i + 1) * d]);
            }
        }
        for (t, o) in out.chunks_exact_mut(d).enumerate().take(n) {
            o.fill(0.0);
            for (j, &(_, w)) in routes[t].iter().enumerate() {
                let y = &slots[(t * k + j) * d..][..d];
                o.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
            }
        }
        Ok(())
    }
}

/// A token's experts from its router logits, as llama.cpp picks them:
/// softmax over all, the `k` most probable (ties: the lower index), their
/// probabilities renormalized to sum 1. gpt-oss's router takes the
/// softmax of the chosen logits alone, the same weights: its bias is
/// added to the logits before.
pub fn route(logits: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut p = logits.to_vec();
    softmax(&mut p);
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    order.truncate(k);
    let sum = order.iter().map(|&e| p[e]).sum::<f32>().max(6.103_515_6e-5);
    order.into_iter().map(|e| (e, p[e] / sum)).collect()
}
