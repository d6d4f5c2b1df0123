//! The decoder layer both backends read (`HyperParams::block`), for the
//! shapes whose layers differ from llama's.

use m40_gguf::hparams::{Arch, Block, LayerRope};
use m40_gguf::synth::{metadata, FileType, Shape};
use m40_gguf::HyperParams;

fn hp(shape: &str) -> HyperParams {
    let s = Shape::find(shape).unwrap();
    HyperParams::from_metadata(&metadata(s, FileType::All(m40_gguf::GgmlType::F32))).unwrap()
}

#[test]
fn smollm3_drops_rope_on_every_fourth_layer() {
    let hp = hp("smollm3-tiny");
    assert_eq!(hp.arch, Arch::SmolLm3);
    let ropes: Vec<LayerRope> = hp.blocks().iter().map(|b| b.rope).collect();
    let mut want = vec![LayerRope::Model; hp.n_layer];
    for l in (3..hp.n_layer).step_by(4) {
        want[l] = LayerRope::None;
    }
    assert!(
        want.contains(&LayerRope::None),
        "the shape has a NoPE layer"
    );
    assert_eq!(ropes, want);
}

#[test]
fn window_layers_take_the_window_and_its_rope() {
    let hp = hp("gemma3-tiny");
    let blocks = hp.blocks();
    let w = hp.sliding_window.as_ref().unwrap();
    for (l, b) in blocks.iter().enumerate() {
        let swa = w.layers[l];
        assert_eq!(b.window, if swa { w.window } else { 0 }, "layer {l}");
        let rope = if swa {
            LayerRope::Window
        } else {
            LayerRope::Model
        };
        assert_eq!(b.rope, rope, "layer {l}");
        assert!(b.head_norms && b.post_norms && !b.parallel);
    }
    assert!(blocks.iter().any(|b| b.window == 0) && blocks.iter().any(|b| b.window > 0));
}

#[test]
fn the_plain_layer_is_llamas() {
    let b = hp("tiny").block(0);
    let plain = Block {
        qkv_bias: false,
        head_norms: false,
        rope: LayerRope::Model,
        window: 0,
        sinks: false,
        out_bias: false,
        parallel: false,
        post_norms: false,
        experts: None,
    };
    assert_eq!(b, plain);
    assert!(b.ffn_norm());
    let c = hp("command-r-tiny").block(0);
    assert!(c.parallel && !c.ffn_norm());
    assert!(hp("qwen3moe-tiny").block(0).experts.is_some());
}
