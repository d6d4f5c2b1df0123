//! Shared by the GPU model tests (gpu_forward, gpu_batch): random-weight
//! models, token ids (m40_gguf's), and how logits are compared.
#![allow(dead_code)]

use std::sync::Arc;

pub use m40_gguf::synth::token_ids as tokens;
use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_model::Model;

/// ||a - b|| / ||b|| over one position's logits.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// The first index of the largest value.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// A random-weight model of `shape` in `ty`, written into `dir`.
pub fn synth(dir: &std::path::Path, shape: &str, ty: impl Into<FileType>) -> Arc<Model> {
    let ty = ty.into();
    let shape = Shape::find(shape).unwrap();
    let path = dir.join(format!("{}-{}.gguf", shape.name, ty.name()));
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    write_model(
        f,
        &SynthOptions {
            shape,
            ty,
            seed: 11,
        },
        |_, _| {},
    )
    .unwrap();
    Arc::new(Model::open(&path).unwrap())
}
