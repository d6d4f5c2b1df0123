use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions, SHAPES};

#[derive(clap::Args)]
pub struct Args {
    /// Model shape (every one `m40-llm synth` knows, by architecture).
    #[arg(long, help = shape_help())]
    pub shape: String,
    /// Weight type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K, or
    /// Q4_K_M (llama-quantize's mix of Q4_K and Q6_K). Norms stay F32. K-quant
    /// blocks take each sub-block's first scale fit, without llama-quantize's
    /// search (7x faster; the weights are random either way).
    #[arg(long = "type", default_value = "F16")]
    pub ty: String,
    /// Random seed; the same seed writes the same file.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output file.
    pub out: PathBuf,
}

/// `--shape`'s help: the shapes of `SHAPES`, grouped by architecture.
fn shape_help() -> String {
    let groups: Vec<String> = m40_gguf::hparams::Arch::ALL
        .iter()
        .filter_map(|&arch| {
            let names: Vec<&str> = SHAPES
                .iter()
                .filter(|s| s.arch == arch)
                .map(|s| s.name)
                .collect();
            (!names.is_empty()).then(|| format!("{} ({})", names.join(", "), arch.name()))
        })
        .collect();
    format!("Model shape: {}", groups.join("; "))
}

pub fn run(a: Args) -> Result<()> {
    let names = || SHAPES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ");
    let shape = Shape::find(&a.shape)
        .ok_or_else(|| anyhow!("unknown shape `{}` (known: {})", a.shape, names()))?;
    let ty = FileType::parse(&a.ty).ok_or_else(|| {
        anyhow!(
            "cannot write type `{}` (supported: {})",
            a.ty,
            FileType::names()
        )
    })?;
    let start = Instant::now();
    let file = File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let opts = SynthOptions {
        shape,
        ty,
        seed: a.seed,
    };
    let out = write_model(
        BufWriter::with_capacity(8 << 20, file),
        &opts,
        |done, total| {
            if done == total || done % 16 == 0 {
                eprint!(
                    "\r{done}/{total} tensors, {:.0} s",
                    start.elapsed().as_secs_f64()
                );
            }
        },
    );
    eprintln!();
    let out = match out {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&a.out);
            return Err(e).context(format!("writing {}", a.out.display()));
        }
    };
    let file = out
        .into_inner()
        .map_err(|e| e.into_error())
        .context("flushing")?;
    file.sync_all()?;
    let size = file.metadata()?.len();
    eprintln!(
        "wrote {} ({} {ty}, {:.2} GB) in {:.1} s",
        a.out.display(),
        shape.name,
        size as f64 / 1e9,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
