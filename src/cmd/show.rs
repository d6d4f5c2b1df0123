use std::collections::BTreeMap;

use anyhow::Result;
use m40_gguf::{GgufFile, HyperParams};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF path or a store name (default: the default model, fetched on first use).
    pub model: Option<String>,
    /// Print one JSON object for scripts.
    #[arg(long)]
    pub json: bool,
    /// Also list every metadata key (arrays summarized).
    #[arg(long)]
    pub metadata: bool,
}

fn tokenizer_kind(f: &GgufFile) -> String {
    let md = f.metadata();
    let model = md.opt_str("tokenizer.ggml.model").ok().flatten();
    let pre = md.opt_str("tokenizer.ggml.pre").ok().flatten();
    let n = md
        .opt_array("tokenizer.ggml.tokens")
        .ok()
        .flatten()
        .map(|a| a.len());
    let kind = match model {
        Some("llama") => "SentencePiece (llama)",
        Some("gpt2") => "byte-level BPE (gpt2)",
        Some("gemma4") => "BPE over SentencePiece text (gemma4)",
        Some("bert") => "WordPiece (bert)",
        Some(other) => other,
        None => return "none".into(),
    };
    let mut s = kind.to_string();
    if let Some(p) = pre {
        s += &format!(", pre-tokenizer {p}");
    }
    if let Some(n) = n {
        s += &format!(", {n} tokens");
    }
    s
}

pub fn run(a: Args) -> Result<()> {
    let path = super::resolve_model(a.model.as_deref())?;
    let f = GgufFile::open(&path)?;
    let arch = f.architecture().unwrap_or("(none)").to_string();
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    for t in f.tensors() {
        *types.entry(t.ty.name().to_string()).or_default() += 1;
    }
    // Hyperparameters from metadata, then the tensor check that loading does.
    let hp = HyperParams::from_metadata(f.metadata());
    let check = hp.as_ref().map_err(|e| e.to_string()).and_then(|_| {
        HyperParams::from_file(&f)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    if a.json {
        let h = hp.as_ref().ok();
        let mut obj = json!({
            "path": path,
            "gguf_version": f.version(),
            "architecture": arch,
            "name": f.metadata().opt_str("general.name").ok().flatten(),
            "n_layer": h.map(|h| h.n_layer),
            "n_embd": h.map(|h| h.n_embd),
            "n_head": h.map(|h| h.n_head),
            "n_head_kv": h.map(|h| h.n_head_kv),
            "head_dim": h.map(|h| h.head_dim),
            "n_ff": h.map(|h| h.n_ff),
            "n_expert": h.and_then(|h| h.moe).map(|m| m.n_expert),
            "n_expert_used": h.and_then(|h| h.moe).map(|m| m.n_expert_used),
            "n_ff_exp": h.and_then(|h| h.moe).map(|m| m.n_ff_exp),
            "sliding_window": h.and_then(|h| h.sliding_window.as_ref()).map(|w| w.window),
            "n_vocab": h.map(|h| h.n_vocab),
            "n_ctx_train": h.map(|h| h.n_ctx_train),
            "rope_freq_base": h.map(|h| h.rope_freq_base),
            "rope_style": h.map(|h| format!("{:?}", h.rope_style).to_lowercase()),
            "rms_eps": h.map(|h| h.rms_eps),
            "tokenizer": tokenizer_kind(&f),
            "n_params": f.n_params(),
            "file_size": f.file_size(),
            "n_tensors": f.tensors().len(),
            "tensor_types": types,
            "check": match &check { Ok(()) => "ok".to_string(), Err(e) => e.clone() },
        });
        if let (Ok(h), Ok(())) = (&hp, &check) {
            obj["tied_output"] = json!(HyperParams::from_file(&f)
                .map(|x| x.tied_output)
                .unwrap_or(h.tied_output));
        }
        println!("{obj}");
        return Ok(());
    }
    println!("{}", path.display());
    println!(
        "  format        GGUF v{}, {:.2} MB, {} tensors, {} metadata keys",
        f.version(),
        f.file_size() as f64 / 1e6,
        f.tensors().len(),
        f.metadata().len()
    );
    if let Ok(Some(name)) = f.metadata().opt_str("general.name") {
        println!("  name          {name}");
    }
    println!("  architecture  {arch}");
    match &hp {
        Ok(h) => {
            println!("  layers        {}", h.n_layer);
            println!("  embedding     {}", h.n_embd);
            println!(
                "  heads         {} (KV {}), head dim {}",
                h.n_head, h.n_head_kv, h.head_dim
            );
            match h.moe {
                Some(m) => println!(
                    "  feed-forward  {} experts, {} a token, {} each",
                    m.n_expert, m.n_expert_used, m.n_ff_exp
                ),
                None => println!("  feed-forward  {}", h.n_ff),
            }
            if let Some(w) = &h.sliding_window {
                let n = w.layers.iter().filter(|&&s| s).count();
                println!(
                    "  window        {} keys on {n} of {} layers (RoPE base {})",
                    w.window, h.n_layer, w.rope_freq_base
                );
            }
            println!("  vocabulary    {}", h.n_vocab);
            println!("  context       {} (trained)", h.n_ctx_train);
            println!(
                "  rope          base {}, {} dims, {:?} style, scaling {:?}",
                h.rope_freq_base, h.rope_dim, h.rope_style, h.rope_scaling
            );
            println!("  rms epsilon   {:e}", h.rms_eps);
        }
        Err(e) => println!("  hyperparams   unavailable: {e}"),
    }
    println!("  tokenizer     {}", tokenizer_kind(&f));
    println!(
        "  parameters    {} ({:.1} M)",
        f.n_params(),
        f.n_params() as f64 / 1e6
    );
    let t: Vec<String> = types.iter().map(|(k, v)| format!("{k} x{v}")).collect();
    println!("  tensor types  {}", t.join(", "));
    match check {
        Ok(()) => println!("  tensors       all present with the expected shapes"),
        Err(e) => println!("  tensors       not runnable: {e}"),
    }
    if a.metadata {
        println!("  metadata:");
        for (k, v) in f.metadata().iter() {
            println!("    {k} = {v}");
        }
    }
    Ok(())
}
