//! Embeddings batched with generations: an embedding's hidden states ride
//! in the same CPU steps as other sequences' logits, and each input's
//! vector is what it is alone (bitwise: the CPU's batched steps are a cold
//! run's). Regression: the logits of the others once overwrote the hidden
//! rows, and the embedding failed ("ended the embedding early").

use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};
use m40_runtime::{
    BackendChoice, CancelToken, EmbedInput, EmbedRequest, Engine, EngineOptions, Prompt, Request,
};

#[test]
fn embeddings_batched_with_generations_are_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let opts = SynthOptions {
        shape: Shape::find("tiny").unwrap(),
        ty: FileType::All(m40_gguf::GgmlType::Q8_0),
        seed: 40,
    };
    write_model(f, &opts, |_, _| {}).unwrap();
    let mut o = EngineOptions::default();
    o.n_ctx = Some(256);
    o.backend = BackendChoice::Cpu;
    let e = Engine::from_path(&path, o).unwrap();
    let req = EmbedRequest::new(vec![
        EmbedInput::Text("one text".into()),
        EmbedInput::Text("and another, longer text".into()),
    ]);
    let embed = || {
        e.embed_start(&req, &CancelToken::new())
            .and_then(|r| r.wait())
            .unwrap()
            .vectors
    };
    let alone = embed();
    std::thread::scope(|s| {
        for t in 0..6 {
            let (e, embed, alone) = (&e, &embed, &alone);
            s.spawn(move || {
                for i in 0..12 {
                    if (i + t) % 3 == 0 {
                        assert_eq!(&embed(), alone, "thread {t}, request {i}");
                    } else {
                        let mut g = Request::new(Prompt::Text("The sea".into()));
                        g.max_tokens = Some(16);
                        e.generate(&g, &CancelToken::new(), |_| {}).unwrap();
                    }
                }
            });
        }
    });
}
