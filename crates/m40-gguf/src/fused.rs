//! Matrices a file holds fused (phi3's Q/K/V and gate/up), read as their
//! parts: the forward passes see llama's layer.

use crate::error::Result;
use crate::file::GgufFile;
use crate::hparams::{Arch, HyperParams, LayerNames};

/// A fused matrix of a file: its name, its row length, and its parts' names
/// and rows, in order ([`HyperParams::fused_tensors`]).
pub type Fused = (String, usize, Vec<(String, usize)>);

impl HyperParams {
    /// phi3's fused matrices: per layer `attn_qkv` (n_embd columns; the Q,
    /// K and V rows) and `ffn_up` (gate rows, then up rows), each with its
    /// parts' names and rows; nomic-bert's `attn_qkv`. Empty for the other
    /// architectures.
    pub fn fused_tensors(&self) -> Vec<Fused> {
        let (q, kv) = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim);
        if self.arch == Arch::NomicBert {
            return (0..self.n_layer)
                .map(|l| {
                    let n = LayerNames::new(l);
                    let parts = vec![(n.wq, q), (n.wk, kv), (n.wv, kv)];
                    (format!("blk.{l}.attn_qkv.weight"), self.n_embd, parts)
                })
                .collect();
        }
        if self.arch != Arch::Phi3 {
            return Vec::new();
        }
        (0..self.n_layer)
            .flat_map(|l| {
                let n = LayerNames::new(l);
                [
                    (
                        format!("blk.{l}.attn_qkv.weight"),
                        self.n_embd,
                        vec![(n.wq, q), (n.wk, kv), (n.wv, kv)],
                    ),
                    (
                        n.ffn_up.clone(),
                        self.n_embd,
                        vec![(n.ffn_gate, self.n_ff), (n.ffn_up, self.n_ff)],
                    ),
                ]
            })
            .collect()
    }

    /// [`Self::expected_tensors`] as a file lays them out: each group of
    /// [`Self::fused_tensors`] that `fused(name)` says the file holds as
    /// its fused matrix, where its first part would be.
    pub fn file_tensors(&self, fused: impl Fn(&str) -> bool) -> Vec<(String, Vec<u64>)> {
        let fused: Vec<Fused> = self
            .fused_tensors()
            .into_iter()
            .filter(|f| fused(&f.0))
            .collect();
        let mut out = Vec::new();
        for (name, shape) in self.expected_tensors() {
            match fused.iter().find(|f| f.2.iter().any(|p| p.0 == name)) {
                Some((f, cols, parts)) if parts[0].0 == name => {
                    let rows = parts.iter().map(|p| p.1 as u64).sum();
                    out.push((f.clone(), vec![*cols as u64, rows]));
                }
                Some(_) => {}
                None => out.push((name, shape)),
            }
        }
        out
    }

    /// Split the fused matrices `file` holds (see [`Self::fused_tensors`])
    /// into their parts' names, so the forward passes read phi3 as llama.
    /// A file with separate Q, K and V keeps them.
    pub fn unfuse(&self, file: &mut GgufFile) -> Result<()> {
        for (name, _, parts) in self.fused_tensors() {
            let rows: usize = parts.iter().map(|p| p.1).sum();
            if file.tensor_info(&name).is_some_and(|t| t.n_rows() == rows) {
                file.split_rows(&name, &parts)?;
            }
        }
        Ok(())
    }
}
