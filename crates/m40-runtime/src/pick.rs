//! Which backend an engine runs on: the CPU, one GPU, or the model's layers
//! placed over several GPUs and the CPU by `m40_model::placement`.

use std::sync::Arc;

use m40_device::Device;
use m40_model::cpu::CpuBackend;
use m40_model::gpu::{GpuBackend, GpuOptions, KV_FIT_HEADROOM};
use m40_model::placement::{self, Ask, Place, Placement, Room};
use m40_model::split::Split;
use m40_model::{AnyBackend, KvFormat, Model, ModelError, Span};

use crate::error::{EngineError, Result};
use crate::options::{BackendChoice, EngineOptions};
use m40_model::{DEFAULT_GPU_SEQUENCES, DEFAULT_SEQUENCES};

/// What [`load_backend`] chose: the backend, why Auto chose the CPU (if
/// it did), and the planner's placement (where it decided).
pub type Picked = (AnyBackend, Option<String>, Option<Placement>);

/// The GPU's page format for `asked`: itself where the GPU takes it for
/// this model, else FP16 with a warning (an encoder's cache, a head size
/// the quantized pages' rotation does not take).
fn gpu_kv_format(hp: &m40_gguf::HyperParams, asked: KvFormat) -> KvFormat {
    if GpuBackend::takes_kv_format(hp, asked) {
        return asked;
    }
    tracing::warn!(
        "a {} KV cache on the GPU takes decoders with head sizes that are multiples of 64 (at most 256): \
         this model's KV cache is f16 (head size {})",
        asked.name(),
        hp.head_dim
    );
    KvFormat::F16
}

/// The CPU's backend: by default DEFAULT_SEQUENCES contexts, halved while
/// the machine has no room for them, down to one context. Its pages are
/// checked against the machine's memory, so that a server refuses to start
/// rather than fail requests.
fn cpu_backend(model: &Arc<Model>, opts: &EngineOptions, n_ctx: usize) -> Result<AnyBackend> {
    let mut kv = opts
        .kv_tokens
        .unwrap_or(n_ctx * DEFAULT_SEQUENCES)
        .max(n_ctx);
    loop {
        match CpuBackend::within(
            model.clone(),
            opts.cpu_math,
            kv,
            opts.kv_type,
            opts.memory_limit,
        ) {
            Err(ModelError::HostMemory { .. }) if opts.kv_tokens.is_none() && kv > n_ctx => {
                kv = (kv / 2).max(n_ctx);
            }
            r => return Ok(AnyBackend::Cpu(r?)),
        }
    }
}

/// The backend `opts` asks for, as an [`crate::Engine`] loads it with a
/// context of `n_ctx` (benchmarks drive it directly): with Auto, the CPU
/// when there is no GPU, and the layers that do not fit the GPUs on the
/// CPU.
pub fn load_backend(model: &Arc<Model>, opts: &EngineOptions, n_ctx: usize) -> Result<Picked> {
    if opts.backend == BackendChoice::Cpu {
        return Ok((cpu_backend(model, opts, n_ctx)?, None, None));
    }
    let ordinals = opts.gpus.clone().unwrap_or_else(|| vec![opts.gpu]);
    let mut devices = Vec::with_capacity(ordinals.len());
    for &o in &ordinals {
        match Device::open(o) {
            Ok(d) => devices.push(d),
            Err(e) if opts.backend == BackendChoice::Auto && opts.gpus.is_none() => {
                let cpu = cpu_backend(model, opts, n_ctx)?;
                return Ok((cpu, Some(format!("no GPU: {e}")), None));
            }
            Err(e) => return Err(EngineError::NoGpu(e)),
        }
    }
    if devices.is_empty() {
        return Err(EngineError::Model(ModelError::Unsupported(
            "an empty list of GPUs (--gpus)".into(),
        )));
    }
    let hp = model.hparams();
    let base = gpu_options(model, opts, n_ctx);
    // The planner where asked; else one GPU, the planner only where Auto
    // lets the CPU take what does not fit (a server's `Fit::Best` asks
    // for the GPU or an error, to unload an idle model first).
    let planned = devices.len() > 1
        || opts.gpu_layers.is_some()
        || opts.tensor_split.is_some()
        || opts.max_vram.is_some();
    // An encoder runs whole (its layers attend both ways in one step).
    let planned = match planned && hp.encoder.is_some() {
        true => {
            tracing::warn!(
                "{} is an encoder: it runs whole on GPU {}, not split",
                hp.arch.name(),
                devices[0].info().ordinal
            );
            false
        }
        false => planned,
    };
    let mut whole_err = None;
    if !planned {
        match GpuBackend::new(devices[0].clone(), model.clone(), base.clone()) {
            Ok(g) => return Ok((AnyBackend::Gpu(Box::new(g)), None, None)),
            // A model one GPU cannot hold: the planner puts what does not
            // fit on the CPU.
            Err(e @ ModelError::GpuMemory { .. })
                if opts.backend == BackendChoice::Auto && hp.encoder.is_none() =>
            {
                whole_err = Some(e)
            }
            Err(e) => return Err(e.into()),
        }
    }
    let placement = match place(model, opts, &devices, &base) {
        Ok(p) => p,
        Err(e) => {
            // Auto with a model neither one GPU nor the planner takes: the
            // CPU's own plan (which halves its pool), or both reasons.
            return match (whole_err, cpu_backend(model, opts, n_ctx)) {
                (Some(g), Ok(c)) => Ok((c, Some(g.to_string()), None)),
                (Some(g), Err(EngineError::Model(c))) => Err(EngineError::NoRoom {
                    gpu: Box::new(g),
                    cpu: Box::new(c),
                }),
                _ => Err(e.into()),
            };
        }
    };
    tracing::info!("{placement}");
    let backend = build(model, opts, &devices, &base, &placement)?;
    let note = match placement.gpu_layers() {
        0 => whole_err.map(|e| e.to_string()),
        _ => None,
    };
    Ok((backend, note, Some(placement)))
}

/// The GPU backend's options `opts` asks for with a context of `n_ctx`:
/// by default DEFAULT_GPU_SEQUENCES contexts, or the whole pages that fit
/// the device's budget, down to one context.
fn gpu_options(model: &Model, opts: &EngineOptions, n_ctx: usize) -> GpuOptions {
    let cap = match (opts.memory_limit, opts.max_vram) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    GpuOptions {
        kv_tokens: opts
            .kv_tokens
            .unwrap_or(n_ctx * DEFAULT_GPU_SEQUENCES)
            .max(n_ctx),
        kv_min_tokens: opts.kv_tokens.is_none().then_some(n_ctx),
        batch_decode: !opts.batch_invariant,
        max_batch: m40_model::DEFAULT_STEP,
        progress: opts.upload_progress.as_ref().map(|p| p.0.clone()),
        kernel_progress: opts.kernel_progress.as_ref().map(|p| p.0.clone()),
        jit_threads: opts.jit_threads,
        memory_limit: cap,
        kv_format: gpu_kv_format(model.hparams(), opts.kv_type),
        ..Default::default()
    }
}

/// A whole copy of the model on each GPU `opts` names
/// ([`EngineOptions::replicas`]), each within the memory it has room for
/// (a GPU named twice shares its room between its copies).
pub fn load_replicas(
    model: &Arc<Model>,
    opts: &EngineOptions,
    n_ctx: usize,
) -> Result<Vec<AnyBackend>> {
    let refuse = |why: &str| Err(EngineError::Model(ModelError::Unsupported(why.into())));
    if opts.backend == BackendChoice::Cpu {
        return refuse(
            "replicas are copies of the model on GPUs (--replicas with --gpus), not on the CPU",
        );
    }
    if opts.gpu_layers.is_some() || opts.tensor_split.is_some() {
        return refuse(
            "--replicas puts a whole model on each GPU; --gpu-layers and --tensor-split split one model",
        );
    }
    let ordinals = opts.gpus.clone().unwrap_or_else(|| vec![opts.gpu]);
    if ordinals.is_empty() {
        return refuse("an empty list of GPUs (--gpus)");
    }
    let mut devices = Vec::with_capacity(ordinals.len());
    for &o in &ordinals {
        devices.push(Device::open(o).map_err(EngineError::NoGpu)?);
    }
    let base = gpu_options(model, opts, n_ctx);
    // Every GPU's room before any copy loads.
    let mut rooms = Vec::with_capacity(devices.len());
    for d in &devices {
        d.synchronize().map_err(ModelError::from)?;
        let (free, _) = d.memory().map_err(ModelError::from)?;
        let times = ordinals.iter().filter(|&&o| o == d.info().ordinal).count() as u64;
        let room = (d.budget_left() as u64).min(free as u64) / times;
        rooms.push(base.memory_limit.map_or(room, |c| c.min(room)));
    }
    let mut backends = Vec::with_capacity(devices.len());
    for (d, room) in devices.into_iter().zip(rooms) {
        let g = GpuOptions {
            memory_limit: Some(room),
            ..base.clone()
        };
        backends.push(AnyBackend::Gpu(Box::new(GpuBackend::new(
            d,
            model.clone(),
            g,
        )?)));
    }
    Ok(backends)
}

/// The placement of `model` over `devices` and the CPU.
fn place(
    model: &Model,
    opts: &EngineOptions,
    devices: &[Arc<Device>],
    base: &GpuOptions,
) -> std::result::Result<Placement, ModelError> {
    if let Some(s) = &opts.tensor_split {
        if s.len() != devices.len() || s.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(ModelError::Unsupported(format!(
                "a tensor split of {} shares for {} GPUs (one non-negative share a GPU, in the order of --gpus)",
                s.len(),
                devices.len()
            )));
        }
    }
    let mut rooms = Vec::with_capacity(devices.len());
    let mut sms = 1;
    for (i, d) in devices.iter().enumerate() {
        // Memory freed on any stream goes back to the driver at a
        // synchronize: the plan sees it free.
        d.synchronize()?;
        let (free, _) = d.memory()?;
        let mut bytes = (d.budget_left() as u64).min(free as u64);
        if let Some(c) = base.memory_limit {
            bytes = bytes.min(c);
        }
        // A GPU named more than once (stages on one card: tests) shares
        // its room among them.
        let times = devices
            .iter()
            .filter(|e| e.info().ordinal == d.info().ordinal)
            .count() as u64;
        let bytes = (bytes / times).saturating_sub(KV_FIT_HEADROOM);
        sms = sms.max(d.info().sm_count as usize);
        rooms.push(Room {
            place: Place::Gpu(d.info().ordinal),
            name: format!("GPU {} ({})", d.info().ordinal, d.info().name),
            bytes,
            share: opts.tensor_split.as_ref().map_or(bytes as f64, |s| s[i]),
        });
    }
    let host_bytes = placement::available_memory().unwrap_or(u64::MAX);
    let host = Room {
        place: Place::Cpu,
        name: "CPU".into(),
        bytes: opts.memory_limit.map_or(host_bytes, |l| l.min(host_bytes)),
        share: 0.0,
    };
    let gpu = m40_model::gpu::costs(model, base, sms, base.kv_tokens);
    let cpu = m40_model::cpu::costs(model, base.kv_format, m40_model::DEFAULT_STEP);
    let ask = Ask {
        kv_tokens: base.kv_tokens,
        min_kv_tokens: base.kv_min_tokens,
        page: m40_model::gpu::KV_PAGE,
        gpu_layers: opts.gpu_layers,
        kv_format: base.kv_format,
    };
    placement::plan(&gpu, &cpu, &rooms, &host, &ask)
}

/// The backend of `placement`: one GPU or the CPU where it is one stage,
/// else a [`Split`] of its stages, each with the placement's KV tokens.
fn build(
    model: &Arc<Model>,
    opts: &EngineOptions,
    devices: &[Arc<Device>],
    base: &GpuOptions,
    placement: &Placement,
) -> Result<AnyBackend> {
    let tokens = placement.kv_tokens;
    let device = |ordinal: usize| -> Arc<Device> {
        devices
            .iter()
            .find(|d| d.info().ordinal == ordinal)
            .expect("the planner's GPUs are the devices given")
            .clone()
    };
    let whole = placement.stages.len() == 1;
    let mut stages = Vec::with_capacity(placement.stages.len());
    for s in &placement.stages {
        let span = Span::of(model.hparams(), s.layers.clone())?;
        stages.push(match s.place {
            Place::Cpu => AnyBackend::Cpu(CpuBackend::stage(
                model.clone(),
                opts.cpu_math,
                tokens,
                base.kv_format,
                None,
                span,
            )?),
            Place::Gpu(o) => {
                let g = GpuOptions {
                    kv_tokens: tokens,
                    kv_min_tokens: None,
                    layers: (!whole).then(|| s.layers.clone()),
                    ..base.clone()
                };
                AnyBackend::Gpu(Box::new(GpuBackend::new(device(o), model.clone(), g)?))
            }
        });
    }
    if whole {
        return Ok(stages.pop().expect("one stage"));
    }
    Ok(AnyBackend::Split(Box::new(Split::new(stages)?)))
}
