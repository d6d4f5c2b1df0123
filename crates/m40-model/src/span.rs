//! Which part of a model a backend runs: a range of its decoder layers, the
//! token embedding where the range starts at the first layer, the output
//! norm and matrix where it ends at the last. A model split over devices
//! (`split.rs`) runs one backend a span; a backend of the whole model has
//! the span of all its layers.

use std::ops::Range;

use m40_gguf::hparams::{OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::HyperParams;

use crate::error::{ModelError, Result};

/// A range of a model's layers (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub layers: Range<usize>,
    /// The model's layers in all.
    pub n_layer: usize,
}

impl Span {
    /// Every layer of `hp`.
    pub fn whole(hp: &HyperParams) -> Span {
        Span {
            layers: 0..hp.n_layer,
            n_layer: hp.n_layer,
        }
    }

    /// Layers `layers` of `hp`: at least one, within the model's; an
    /// encoder runs whole.
    pub fn of(hp: &HyperParams, layers: Range<usize>) -> Result<Span> {
        if layers.is_empty() || layers.end > hp.n_layer {
            return Err(ModelError::Unsupported(format!(
                "layers {}..{} of a model of {} layers",
                layers.start, layers.end, hp.n_layer
            )));
        }
        let span = Span {
            layers,
            n_layer: hp.n_layer,
        };
        if hp.encoder.is_some() && !span.is_whole() {
            return Err(ModelError::Unsupported(format!(
                "part of an encoder's layers ({}): it runs on one device",
                hp.arch.name()
            )));
        }
        Ok(span)
    }

    /// Whether it embeds the tokens (its layers start at the first).
    pub fn first(&self) -> bool {
        self.layers.start == 0
    }

    /// Whether it computes the outputs (its layers end at the last).
    pub fn last(&self) -> bool {
        self.layers.end == self.n_layer
    }

    pub fn is_whole(&self) -> bool {
        self.first() && self.last()
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Whether tensor `name` of a model of `hp` is this span's: a layer's
    /// where the layer is in it, the token embedding where it embeds (or
    /// computes the outputs through the embedding, tied), the output norm
    /// and matrix where it computes the outputs; any other (RoPE factors)
    /// every span's.
    pub fn holds(&self, name: &str, hp: &HyperParams) -> bool {
        if let Some(l) = layer_of(name) {
            return self.layers.contains(&l);
        }
        match name {
            TOKEN_EMBD => self.first() || (self.last() && hp.tied_output),
            OUTPUT | OUTPUT_NORM => self.last(),
            _ => true,
        }
    }

    /// The bytes of `model`'s file its tensors take (the whole file for a
    /// whole model: what the CPU maps).
    pub fn weight_bytes(&self, model: &crate::Model) -> u64 {
        if self.is_whole() {
            return model.file().file_size();
        }
        let hp = model.hparams();
        model
            .file()
            .tensors()
            .iter()
            .filter(|t| self.holds(&t.name, hp))
            .map(|t| t.n_bytes)
            .sum()
    }

    /// "layers 3-17" (one-based, inclusive, as people count them), with
    /// what else it holds.
    pub fn describe(&self) -> String {
        let mut s = match self.layers.len() {
            1 => format!("layer {}", self.layers.start + 1),
            _ => format!("layers {}-{}", self.layers.start + 1, self.layers.end),
        };
        match (self.first(), self.last()) {
            (true, true) => s.push_str(", embedding and output"),
            (true, false) => s.push_str(", embedding"),
            (false, true) => s.push_str(", output"),
            (false, false) => {}
        }
        s
    }
}

/// The layer of a tensor named `blk.N.*`.
pub fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    rest[..rest.find('.')?].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_holds_its_layers_and_the_ends_it_touches() {
        let dir = tempfile::tempdir().unwrap();
        let model = crate::cpu::tiny_model(&dir, 1);
        let hp = model.hparams();
        assert!(hp.n_layer >= 2);
        let n = hp.n_layer;
        let head = Span::of(hp, 0..1).unwrap();
        let tail = Span::of(hp, 1..n).unwrap();
        assert!(head.first() && !head.last() && !tail.first() && tail.last());
        assert!(Span::whole(hp).is_whole());
        assert!(head.holds("blk.0.attn_q.weight", hp));
        assert!(!head.holds("blk.1.attn_q.weight", hp));
        assert!(tail.holds(&format!("blk.{}.ffn_down.weight", n - 1), hp));
        assert!(head.holds(TOKEN_EMBD, hp) && !head.holds(OUTPUT_NORM, hp));
        assert!(tail.holds(OUTPUT_NORM, hp));
        assert_eq!(tail.holds(TOKEN_EMBD, hp), hp.tied_output);
        // Every tensor is held by exactly one of a split's spans, but the
        // tied embedding (both ends) and tensors of no layer (each).
        for (name, _) in hp.expected_tensors() {
            let held = [&head, &tail].iter().filter(|s| s.holds(&name, hp)).count();
            let want = if name == TOKEN_EMBD && hp.tied_output {
                2
            } else {
                1
            };
            assert_eq!(held, want, "{name}");
        }
        assert_eq!(head.describe(), "layer 1, embedding");
        let want = match n {
            2 => "layer 2, output".to_string(),
            _ => format!("layers 2-{n}, output"),
        };
        assert_eq!(tail.describe(), want);
        // Nothing, or past the model: refused.
        assert!(Span::of(hp, 1..1).is_err());
        assert!(Span::of(hp, 0..n + 1).is_err());
        assert_eq!(layer_of("blk.12.attn_k.weight"), Some(12));
        assert_eq!(layer_of("output.weight"), None);
    }
}
