//! What `m40-llm bench` measures against: the device's read and FP32
//! ceilings, and the bytes a decode step reads.

use anyhow::Result;
use m40_device::Device;
use m40_kernels::Kernels;
use m40_model::Model;

/// The measured ceilings of the device.
pub(super) struct Ceilings {
    pub(super) read_gbps: f64,
    pub(super) fp32_tflops: f64,
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Read bandwidth (read_probe over 2 GiB or a quarter of the free memory)
/// and the FP32 FMA rate (fma_probe), medians of 20 runs timed with events.
pub(super) fn ceilings(dev: &std::sync::Arc<Device>) -> Result<Ceilings> {
    let s = dev.new_stream()?;
    let k = Kernels::new(dev.clone());
    let (free, _) = dev.memory()?;
    let bytes = (2usize << 30).min(free / 4) & !0xFFFF;
    let mut buf = s.alloc::<u8>(bytes, "bandwidth probe")?;
    k.fill_random(&s, &mut buf, 1)?;
    let mut sink = s.alloc::<u32>(k.probe_blocks(), "probe output")?;
    let mut fma_out = s.alloc::<f32>(k.probe_blocks() * 256, "probe output")?;
    let view = buf.view();
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        f()?; // warm-up
        let mut t = Vec::new();
        for _ in 0..20 {
            let a = s.record()?;
            f()?;
            let b = s.record()?;
            b.synchronize()?;
            t.push(a.elapsed_ms(&b)? as f64);
        }
        Ok(median(t))
    };
    let read_ms = time(&mut || Ok(k.read_probe(&s, &view, &mut sink)?))?;
    let iters = 8192;
    let mut flops = 0;
    let fma_ms = time(&mut || {
        flops = k.fma_probe(&s, &mut fma_out, iters)?;
        Ok(())
    })?;
    Ok(Ceilings {
        read_gbps: bytes as f64 / read_ms / 1e6,
        fp32_tflops: flops as f64 / fma_ms / 1e9,
    })
}

/// Bytes of the weights a one-token decode step reads: each matrix once
/// (the token embedding contributes one row, unless it is also the
/// output; a mixture's expert tensors, the token's `used` of their
/// `n_expert` matrices).
pub(super) fn decode_weight_bytes(model: &Model) -> u64 {
    let hp = model.hparams();
    let f = model.file();
    hp.expected_tensors()
        .iter()
        .filter_map(|(name, _)| f.tensor_info(name))
        .map(|t| {
            if t.name == m40_gguf::hparams::TOKEN_EMBD && !hp.tied_output {
                t.row_bytes() as u64
            } else if let (3, Some(m)) = (t.shape.len(), hp.moe) {
                t.n_bytes / m.n_expert as u64 * m.n_expert_used as u64
            } else {
                t.n_bytes
            }
        })
        .sum()
}

/// A mixture's bytes of one expert (its gate, up and down matrices) in
/// each layer (empty for a dense model).
pub(super) fn expert_bytes(model: &Model) -> Vec<u64> {
    let hp = model.hparams();
    let Some(m) = hp.moe else {
        return Vec::new();
    };
    let mut per = vec![0u64; hp.n_layer];
    for (name, _) in hp.expected_tensors() {
        let Some(t) = model.file().tensor_info(&name) else {
            continue;
        };
        let layer = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<usize>().ok());
        if let (3, Some(l)) = (t.shape.len(), layer) {
            per[l] += t.n_bytes / m.n_expert as u64;
        }
    }
    per
}
