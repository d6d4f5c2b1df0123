//! The weights on the device: uploaded in their GGUF formats or packed for
//! the GEMV, stacked where matrices share an input, and what of them a
//! model needs (kernel modules, bytes) known before anything is uploaded.

use m40_device::{DeviceBuffer, DeviceView, Stream};
use m40_gguf::hparams::{Activation, Block, RopeStyle, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use m40_gguf::{GgmlType, HyperParams, TensorView};
use m40_kernels::{
    gemm_plan, interleave_glu, modules_for, pack_gemv, GemmSlots, GemmTile, KernelFormat,
    PackFormat, PackedMatrix, QMatrix, PACK_ROWS,
};

use super::GpuOptions;
use crate::error::{ModelError, Result};
use crate::{Model, Span};

/// A weight matrix on the device: GGUF rows, or the packed layout.
pub(super) struct Mat {
    pub(super) ty: GgmlType,
    pub(super) data: DeviceBuffer<u8>,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) packed: bool,
}

impl Mat {
    /// The launchers' view of the matrix: packed, or GGUF rows.
    pub(super) fn view<'a>(&self, data: &'a DeviceView<'a, u8>) -> MatView<'a> {
        let (ty, rows, cols) = (self.ty, self.rows, self.cols);
        if self.packed {
            MatView::Packed(PackedMatrix {
                ty,
                data,
                rows,
                cols,
            })
        } else {
            MatView::Rows(QMatrix {
                ty,
                data,
                rows,
                cols,
            })
        }
    }
}

/// A [`Mat`]'s launcher view.
pub(super) enum MatView<'a> {
    Packed(PackedMatrix<'a>),
    Rows(QMatrix<'a>),
}

/// Whether the Q and K heads of a NeoX-style model are uploaded with each
/// rotated pair's rows adjacent ([`pairs_adjacent`]), so that the GPU
/// rotates them in the normal (llama) style and the one-token Q/K/V GEMV
/// can rotate and append them itself (`GemvOut::RopeKv`, pair by pair).
/// q . k is the same over any one order of a head's dimensions applied to
/// both, so nothing downstream changes (the cache holds K in that order).
/// With `fuse` (the fold's switch) and no head norms (whose fold would need
/// the whole head), over FP16 pages: a quantized page's blocks are the
/// head's dimensions in the model's order, rotated as the CPU rotates
/// them (the same blocks on both), and its keys take no fold.
pub(super) fn neox_pairs_adjacent(opts: &GpuOptions, hp: &HyperParams) -> bool {
    opts.fuse
        && hp.rope_style == RopeStyle::Neox
        && !hp.qk_norm
        && opts.kv_format == crate::KvFormat::F16
}

/// `rows` (`width` elements a row; heads of `head_dim` rows) with each
/// head's NeoX pairs (i, i + n_rot / 2) made rows 2i and 2i + 1; rows from
/// n_rot up keep their places.
pub(super) fn pairs_adjacent<T: Copy>(
    rows: &[T],
    width: usize,
    head_dim: usize,
    n_rot: usize,
) -> Vec<T> {
    let half = n_rot / 2;
    let mut out = Vec::with_capacity(rows.len());
    for head in rows.chunks(width * head_dim) {
        let row = |r: usize| &head[r * width..(r + 1) * width];
        for i in 0..half {
            out.extend_from_slice(row(i));
            out.extend_from_slice(row(i + half));
        }
        out.extend_from_slice(&head[n_rot * width..]);
    }
    out
}

/// Whether a matrix of `ty` with `cols` columns is uploaded packed.
pub(super) fn packs(opts: &GpuOptions, ty: GgmlType, cols: usize) -> bool {
    opts.packed && PackFormat::of(ty).is_some_and(|f| cols.is_multiple_of(f.qk))
}

/// Device bytes of a weight tensor as uploaded (the packed layout pads the
/// rows to groups of 4, and Q4_K's unpacked scales take 4 bytes more per
/// super-block).
pub(super) fn device_bytes(opts: &GpuOptions, hp: &HyperParams, t: &m40_gguf::TensorInfo) -> u64 {
    match PackFormat::of(t.ty) {
        Some(f) if !in_rows(opts, hp, t) && packs(opts, t.ty, t.row_len()) => {
            f.packed_bytes(t.n_rows(), t.row_len()) as u64
        }
        _ => t.n_bytes,
    }
}

/// Matrices applied to the same input (Q, K, V; gate, up), stacked into
/// one upload where they share a packed format: `parts` holds each one's
/// rows in order, and each part is written to its own output buffer.
pub(super) struct Stack {
    pub(super) mat: Mat,
    pub(super) parts: Vec<usize>,
    /// A gate/up pair interleaved for SwiGLU (`interleave_glu`): one
    /// output of half the rows, act(gate) * up.
    pub(super) glu: bool,
}

pub(super) struct Layer {
    /// What the layer is (the description the CPU backend reads too).
    pub(super) block: Block,
    pub(super) attn_norm: DeviceBuffer<f32>,
    /// None where attention and FFN share the attention norm (command-r).
    pub(super) ffn_norm: Option<DeviceBuffer<f32>>,
    /// Q's, K's and V's biases, in one buffer in that order.
    pub(super) bias: Option<DeviceBuffer<f32>>,
    /// The query and key head norms' weights (qwen3: head_dim each;
    /// command-r+: every head's).
    pub(super) qk_norm: Option<[DeviceBuffer<f32>; 2]>,
    /// gemma: the attention's and the FFN's output norms' weights.
    pub(super) post_norms: Option<[DeviceBuffer<f32>; 2]>,
    /// gpt-oss: the attention output's bias, each query head's sink.
    pub(super) bo: Option<DeviceBuffer<f32>>,
    pub(super) sinks: Option<DeviceBuffer<f32>>,
    /// Q, K, V in one to three stacks.
    pub(super) qkv: Vec<Stack>,
    pub(super) wo: Mat,
    pub(super) ffn: Ffn,
}

/// A layer's FFN.
pub(super) enum Ffn {
    /// Gate and up in one or two stacks; down.
    Dense { gate_up: Vec<Stack>, down: Mat },
    /// A mixture of experts.
    Moe(Box<MoeMats>),
}

/// A mixture's matrices, in GGUF rows (the experts' GEMV, `gemv_experts`,
/// reads them): the router (F32 as files keep it), the experts' gate and
/// up, and their down.
pub(super) struct MoeMats {
    pub(super) router: Mat,
    pub(super) gate_up: Experts,
    pub(super) down: Mat,
    /// gpt-oss's biases.
    pub(super) bias: Option<MoeBias>,
}

/// A mixture's biases (gpt-oss).
pub(super) struct MoeBias {
    /// The router's (n_expert).
    pub(super) router: DeviceBuffer<f32>,
    pub(super) gate_up: GluBias,
    /// The experts' down biases (n_expert, n_embd).
    pub(super) down: DeviceBuffer<f32>,
}

/// The experts' gate and up biases.
pub(super) enum GluBias {
    /// (n_expert, n_ff_exp) each: for the GEMV of GGUF rows, which adds
    /// them in its epilogue, and for split gate and up (`moe_glu`).
    Apart([DeviceBuffer<f32>; 2]),
    /// Both in each expert's gate/up stack's row order (`interleave_glu`),
    /// (n_expert, 2 n_ff_exp): for the packed experts' GEMV.
    Rows(DeviceBuffer<f32>),
}

pub(super) enum Experts {
    /// Each expert's gate and up interleaved (`interleave_glu`): one GEMV
    /// launch computes act(gate + bias) * (up + bias).
    Glu(Mat),
    /// Apart (their formats differ, or `GpuOptions::fuse` is off).
    Split(Mat, Mat),
}

/// Every weight of the model on the device.
/// Every weight of the backend's span (`crate::Span`) on the device: the
/// token embedding where it embeds or computes the outputs through it
/// (tied), its layers, the output norm and matrix where it computes the
/// outputs.
pub(super) struct Weights {
    pub(super) embd: Option<Mat>,
    pub(super) layers: Vec<Layer>,
    pub(super) output_norm: Option<DeviceBuffer<f32>>,
    /// None: tied to the embedding, or not this span's.
    pub(super) output: Option<Mat>,
}

impl Weights {
    /// The output matrix (the embedding where they are tied); None in a
    /// span that does not compute the outputs.
    pub(super) fn output(&self) -> Option<&Mat> {
        self.output_norm.as_ref()?;
        self.output.as_ref().or(self.embd.as_ref())
    }

    /// The token embedding (a span that embeds has it).
    pub(super) fn embd(&self) -> Result<&Mat> {
        self.embd
            .as_ref()
            .ok_or_else(|| ModelError::Unsupported("embedding tokens in a later stage".into()))
    }

    /// The output norm and matrix (a span that computes the outputs has
    /// them).
    pub(super) fn head(&self) -> Result<(&DeviceBuffer<f32>, &Mat)> {
        match (&self.output_norm, self.output()) {
            (Some(n), Some(o)) => Ok((n, o)),
            _ => Err(ModelError::Unsupported(
                "the outputs of an earlier stage".into(),
            )),
        }
    }

    /// Upload `model`'s weights as `opts` says; `w` bytes in all (for
    /// `opts.progress`).
    pub(super) fn upload(
        model: &Model,
        opts: &GpuOptions,
        span: &Span,
        stream: &Stream,
        w: u64,
    ) -> Result<Weights> {
        let hp = model.hparams();
        let mut done = 0u64;
        // The Q and K matrices whose heads' pairs are made adjacent.
        let adjacent = neox_pairs_adjacent(opts, hp);
        let heads_of: std::collections::HashSet<String> = match adjacent {
            true => (0..hp.n_layer)
                .flat_map(|l| {
                    let n = model.layer(l);
                    [n.wq.clone(), n.wk.clone()]
                })
                .collect(),
            false => Default::default(),
        };
        // Upload `names` stacked into one matrix (rows concatenated, then
        // packed when `may_pack` and the format allows).
        let mut upload_rows = |names: &[&str], may_pack: bool, glu: bool| -> Result<Mat> {
            let ts: Vec<_> = names.iter().map(|n| model.tensor(n)).collect();
            let (ty, cols) = (ts[0].info.ty, ts[0].info.row_len());
            KernelFormat::of(ty, "gpu backend")?;
            let rows: usize = ts.iter().map(|t| t.info.n_rows()).sum();
            let packed = may_pack && packs(opts, ty, cols);
            let what = names.join(" + ");
            let datas: Vec<std::borrow::Cow<[u8]>> = ts
                .iter()
                .zip(names)
                .map(|(t, n)| match heads_of.contains(*n) {
                    true => {
                        let width = t.data.len() / t.info.n_rows();
                        pairs_adjacent(t.data, width, hp.head_dim, hp.rope_dim).into()
                    }
                    false => t.data.into(),
                })
                .collect();
            let joined;
            let bytes: &[u8] = if ts.len() == 1 {
                &datas[0]
            } else if glu {
                joined = interleave_glu(&datas[0], &datas[1], ts[0].info.n_rows())?;
                &joined
            } else {
                let mut v = Vec::with_capacity(datas.iter().map(|d| d.len()).sum());
                datas.iter().for_each(|d| v.extend_from_slice(d));
                joined = v;
                &joined
            };
            let data = if packed {
                stream.upload(&pack_gemv(ty, bytes, rows, cols)?, &what)?
            } else {
                stream.upload(bytes, &what)?
            };
            done = (done + data.len() as u64).min(w);
            if let Some(p) = &opts.progress {
                p(done, w);
            }
            Ok(Mat {
                ty,
                data,
                rows,
                cols,
                packed,
            })
        };
        // Matrices of one input, stacked in runs of the same packed format
        // whose row counts keep the packed groups of 4 apart.
        let fusable = |a: &str, b: &str| {
            let (a, b) = (model.tensor(a).info, model.tensor(b).info);
            opts.fuse
                && a.ty == b.ty
                && a.row_len() == b.row_len()
                && packs(opts, a.ty, a.row_len())
                && a.n_rows().is_multiple_of(PACK_ROWS)
                && b.n_rows().is_multiple_of(PACK_ROWS)
        };
        // `glu`: names are a gate and an up matrix; stacked, they are
        // interleaved for the SwiGLU GEMV.
        let mut stacks = |names: &[&str], may_pack: bool, glu: bool| -> Result<Vec<Stack>> {
            let mut out = Vec::new();
            let mut i = 0;
            while i < names.len() {
                let mut j = i + 1;
                while may_pack && j < names.len() && fusable(names[i], names[j]) {
                    j += 1;
                }
                let rows: Vec<usize> = names[i..j]
                    .iter()
                    .map(|n| model.tensor(n).info.n_rows())
                    .collect();
                let glu = glu && j - i == 2;
                out.push(Stack {
                    mat: upload_rows(&names[i..j], may_pack, glu)?,
                    parts: if glu { vec![rows[0] + rows[1]] } else { rows },
                    glu,
                });
                i = j;
            }
            Ok(out)
        };
        let one =
            |s: Vec<Stack>| -> Mat { s.into_iter().next().expect("one matrix, one stack").mat };
        let f32s = |name: &str| -> Result<DeviceBuffer<f32>> {
            let v = model.tensor(name).to_f32()?;
            Ok(stream.upload(&v, name)?)
        };
        // The embedding is packed only when it is also the output matrix.
        let embd = match span.holds(TOKEN_EMBD, hp) {
            true => Some(one(stacks(
                &[TOKEN_EMBD],
                hp.tied_output && hp.encoder.is_none(),
                false,
            )?)),
            false => None,
        };
        if hp.encoder.is_some() {
            // An encoder's layers are `encoder.rs`'s; it has no output.
            return Ok(Weights {
                embd,
                layers: Vec::new(),
                output_norm: None,
                output: None,
            });
        }
        let mut layers = Vec::with_capacity(span.len());
        let blocks = hp.blocks().into_iter().enumerate();
        for (l, block) in blocks.filter(|(l, _)| span.layers.contains(l)) {
            let n = model.layer(l);
            let bias = if block.qkv_bias {
                // Q's and K's in their matrices' row order.
                let heads = |v: Vec<f32>| match adjacent {
                    true => pairs_adjacent(&v, 1, hp.head_dim, hp.rope_dim),
                    false => v,
                };
                let mut b = heads(model.tensor(&n.bq).to_f32()?);
                b.extend(heads(model.tensor(&n.bk).to_f32()?));
                b.extend(model.tensor(&n.bv).to_f32()?);
                Some(stream.upload(&b, &format!("blk.{l}.attn_qkv biases"))?)
            } else {
                None
            };
            let qk_norm = if block.head_norms {
                Some([f32s(&n.q_norm)?, f32s(&n.k_norm)?])
            } else {
                None
            };
            let post_norms = if block.post_norms {
                Some([f32s(&n.attn_post_norm)?, f32s(&n.ffn_post_norm)?])
            } else {
                None
            };
            // The interleaved dense gate/up GEMV computes SwiGLU and GeGLU
            // (gpt-oss's gate is its experts' only).
            let interleave = hp.act != Activation::SwigluOai;
            let opt = |on: bool, name: &str| on.then(|| f32s(name)).transpose();
            layers.push(Layer {
                block,
                attn_norm: f32s(&n.attn_norm)?,
                ffn_norm: opt(block.ffn_norm(), &n.ffn_norm)?,
                bias,
                qk_norm,
                post_norms,
                bo: opt(block.out_bias, &n.bo)?,
                sinks: opt(block.sinks, &n.sinks)?,
                qkv: stacks(&[&n.wq, &n.wk, &n.wv], true, false)?,
                wo: one(stacks(&[&n.wo], true, false)?),
                ffn: if let Some(m) = block.experts {
                    let (g, u) = (model.tensor(&n.ffn_gate_exps), model.tensor(&n.ffn_up_exps));
                    // Each expert's matrix (its gate and up interleaved, with
                    // `up`), packed where `experts_packed` says, one after
                    // another; a tensor neither changes is uploaded as it is.
                    let mut experts =
                        |t: &TensorView<'_>, up: Option<&TensorView<'_>>| -> Result<Mat> {
                            let packed = experts_packed(opts, hp, t.info);
                            if up.is_none() && !packed {
                                return Ok(one(stacks(&[t.info.name.as_str()], false, false)?));
                            }
                            let (ty, cols) = (t.info.ty, t.info.row_len());
                            let per = t.info.n_rows() / m.n_expert;
                            let rows = if up.is_some() { 2 * per } else { per };
                            let mut joined = Vec::with_capacity(2 * t.data.len());
                            for e in 0..m.n_expert {
                                let ti = t.info.matrix(e);
                                let te = t.matrix(&ti, e);
                                let mat: std::borrow::Cow<[u8]> = match up {
                                    Some(u) => {
                                        let ui = u.info.matrix(e);
                                        interleave_glu(te.data, u.matrix(&ui, e).data, per)?.into()
                                    }
                                    None => te.data.into(),
                                };
                                match packed {
                                    true => joined.extend(pack_gemv(ty, &mat, rows, cols)?),
                                    false => joined.extend_from_slice(&mat),
                                }
                            }
                            let what = match up {
                                Some(u) => format!("{} + {}", t.info.name, u.info.name),
                                None => t.info.name.clone(),
                            };
                            Ok(Mat {
                                ty,
                                data: stream.upload(&joined, &what)?,
                                rows: rows * m.n_expert,
                                cols,
                                packed,
                            })
                        };
                    let gate_up =
                        if opts.fuse && g.info.ty == u.info.ty && m.n_ff_exp.is_multiple_of(2) {
                            Experts::Glu(experts(&g, Some(&u))?)
                        } else {
                            Experts::Split(experts(&g, None)?, experts(&u, None)?)
                        };
                    let down = experts(&model.tensor(&n.ffn_down_exps), None)?;
                    let bias = match m.bias {
                        true => Some(MoeBias {
                            router: f32s(&n.ffn_gate_inp_b)?,
                            gate_up: match &gate_up {
                                Experts::Glu(mat) if mat.packed => {
                                    let g = model.tensor(&n.ffn_gate_exps_b).to_f32()?;
                                    let u = model.tensor(&n.ffn_up_exps_b).to_f32()?;
                                    let what = format!("blk.{l}.ffn_gate_up_exps biases");
                                    GluBias::Rows(stream.upload(&interleave_rows(&g, &u)?, &what)?)
                                }
                                _ => GluBias::Apart([
                                    f32s(&n.ffn_gate_exps_b)?,
                                    f32s(&n.ffn_up_exps_b)?,
                                ]),
                            },
                            down: f32s(&n.ffn_down_exps_b)?,
                        }),
                        false => None,
                    };
                    Ffn::Moe(Box::new(MoeMats {
                        router: one(stacks(&[&n.ffn_gate_inp], false, false)?),
                        gate_up,
                        down,
                        bias,
                    }))
                } else {
                    Ffn::Dense {
                        gate_up: stacks(&[&n.ffn_gate, &n.ffn_up], true, interleave)?,
                        down: one(stacks(&[&n.ffn_down], true, false)?),
                    }
                },
            });
        }
        let output = match span.holds(OUTPUT, hp) && !hp.tied_output {
            true => Some(one(stacks(&[OUTPUT], true, false)?)),
            false => None,
        };
        let output_norm = span.last().then(|| f32s(OUTPUT_NORM)).transpose()?;
        if let Some(p) = &opts.progress {
            p(w, w);
        }
        Ok(Weights {
            embd,
            layers,
            output_norm,
            output,
        })
    }
}

/// The kernel modules (m40_kernels::MODULES) a [`GpuBackend`] for `model`
/// with `opts` launches from, loaded (JIT-compiled on a first run) up front:
/// of the sources compiled in parts, only the parts of the model's formats
/// (the GEMV of GGUF rows only for matrices that are not packed); the
/// persistent decode kernel only when asked for; never the benchmark probes.
pub(super) fn modules_needed(model: &Model, opts: &GpuOptions) -> Vec<&'static str> {
    let hp = model.hparams();
    let file = model.file();
    let (mut packed, mut rows) = (Vec::new(), Vec::new());
    for (name, shape) in hp.expected_tensors() {
        // An untied token embedding is only gathered (the embed module);
        // biases are added, not multiplied.
        if shape.len() < 2 || name.ends_with(".bias") || (name == TOKEN_EMBD && !hp.tied_output) {
            continue;
        }
        let Some(t) = file.tensor_info(&name) else {
            continue;
        };
        let Ok(f) = KernelFormat::of(t.ty, "gpu backend") else {
            continue;
        };
        let list = if uploads_packed(opts, hp, t) {
            &mut packed
        } else {
            &mut rows
        };
        if !list.contains(&f.symbol) {
            list.push(f.symbol);
        }
    }
    let all: Vec<&str> = packed.iter().chain(&rows).copied().collect();
    let mut m = modules_for("gemm", &all);
    m.extend(modules_for("gemv_packed", &packed));
    if !rows.is_empty() {
        m.extend(modules_for("gemv", &rows));
    }
    m.extend([
        "attention",
        "embed",
        "sample",
        "rmsnorm",
        "rope",
        "elementwise",
    ]);
    if opts.persistent {
        m.push("decode");
    }
    if hp.moe.is_some() {
        m.push("moe");
    }
    if hp.encoder.is_some() {
        m.push("encoder");
    }
    m
}

/// Gate and up biases (one value a row, n_ff rows an expert, n_ff even)
/// in the row order `interleave_glu` gives their matrices: gate 2i, gate
/// 2i + 1, up 2i, up 2i + 1, ... (pairs never cross an expert's rows).
fn interleave_rows(gate: &[f32], up: &[f32]) -> Result<Vec<f32>> {
    let rows = interleave_glu(
        bytemuck::cast_slice(gate),
        bytemuck::cast_slice(up),
        gate.len(),
    )?;
    Ok(rows
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The rows tile's modules (kernels/gemm_rows.cu) a [`GpuBackend`] for
/// `model` may launch on a GPU of `gpu`'s slots: the formats of the packed
/// matrices, and of layer 0's Q/K/V and gate/up stacks, whose GEMM of up to
/// 32 tokens takes that tile (`gemm_plan`). Loaded up front with them, not
/// on a first batched step, and not at all where nothing takes the tile (a
/// module is JIT-compiled whole on a first run). A stack missed here still
/// runs, its module loaded when first launched.
pub(super) fn rows_modules(model: &Model, opts: &GpuOptions, gpu: GemmSlots) -> Vec<&'static str> {
    let hp = model.hparams();
    let file = model.file();
    let packed = |t: &m40_gguf::TensorInfo| t.shape.len() == 2 && uploads_packed(opts, hp, t);
    let takes = |rows: usize, cols: usize| gemm_plan(32, rows, cols, gpu).tile == GemmTile::Rows;
    let mut formats: Vec<&'static str> = Vec::new();
    let mut add = |ty: GgmlType| {
        if let Ok(f) = KernelFormat::of(ty, "gpu backend") {
            if !formats.contains(&f.symbol) {
                formats.push(f.symbol);
            }
        }
    };
    for (name, _) in hp.expected_tensors() {
        if let Some(t) = file.tensor_info(&name).filter(|t| packed(t)) {
            if takes(t.n_rows(), t.row_len()) {
                add(t.ty);
            }
        }
    }
    let l0 = m40_gguf::hparams::LayerNames::new(0);
    for stack in [
        [&l0.wq, &l0.wk, &l0.wv].as_slice(),
        &[&l0.ffn_gate, &l0.ffn_up],
    ] {
        let ts: Vec<_> = stack.iter().filter_map(|n| file.tensor_info(n)).collect();
        let same = ts.len() == stack.len() && ts.iter().all(|t| packed(t) && t.ty == ts[0].ty);
        if same && takes(ts.iter().map(|t| t.n_rows()).sum(), ts[0].row_len()) {
            add(ts[0].ty);
        }
    }
    modules_for("gemm_rows", &formats)
}

/// Whether a weight tensor is uploaded in the packed layout.
fn uploads_packed(opts: &GpuOptions, hp: &HyperParams, t: &m40_gguf::TensorInfo) -> bool {
    !in_rows(opts, hp, t) && packs(opts, t.ty, t.row_len())
}

/// Whether a tensor stays in GGUF rows: an encoder's (`encoder.rs`), a
/// mixture's router, and its experts where they are not packed
/// (`experts_packed`).
pub(super) fn in_rows(opts: &GpuOptions, hp: &HyperParams, t: &m40_gguf::TensorInfo) -> bool {
    hp.encoder.is_some()
        || t.name.ends_with("ffn_gate_inp.weight")
        || (t.shape.len() == 3 && !experts_packed(opts, hp, t))
}

/// Whether a mixture's experts tensor `t` (3-D) is uploaded in the packed
/// layout, expert by expert, for the packed experts' GEMV
/// (`gemv_packed_experts`): `fuse` and `packed` on, and a packed format
/// that takes its matrices (gpt-oss's MXFP4 too: the gate/up GEMV adds its
/// biases, `GluBias::Rows`; the down biases are `moe_combine`'s).
pub(super) fn experts_packed(
    opts: &GpuOptions,
    hp: &HyperParams,
    t: &m40_gguf::TensorInfo,
) -> bool {
    let per = t.shape.get(1).map_or(0, |&r| r as usize);
    opts.fuse
        && hp.moe.is_some()
        && packs(opts, t.ty, t.row_len())
        && PackFormat::of(t.ty).is_some_and(|f| f.takes_experts(per, t.row_len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};

    /// A row's bias lands where `interleave_glu` puts that row.
    #[test]
    fn biases_follow_their_rows_interleaved() {
        let gate: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let up: Vec<f32> = (0..6).map(|i| 10.0 + i as f32).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let rows = interleave_glu(&bytes(&gate), &bytes(&up), 6).unwrap();
        let got = interleave_rows(&gate, &up).unwrap();
        assert_eq!(bytes(&got), rows);
        assert_eq!(
            got,
            [0.0, 1.0, 10.0, 11.0, 2.0, 3.0, 12.0, 13.0, 4.0, 5.0, 14.0, 15.0]
        );
    }

    fn synth(shape: &str, ty: GgmlType) -> Model {
        let opts = SynthOptions {
            shape: Shape::find(shape).unwrap(),
            ty: FileType::All(ty),
            seed: 0,
        };
        let bytes = write_model(Vec::new(), &opts, |_, _| {}).unwrap();
        Model::from_file(m40_gguf::GgufFile::from_bytes(bytes).unwrap()).unwrap()
    }

    /// A NeoX head's pairs made adjacent: rows 2i, 2i + 1 are the pair (i,
    /// i + n_rot / 2), the rows from n_rot up stay, head by head; which
    /// models are uploaded so.
    #[test]
    fn neox_pairs_are_made_adjacent() {
        // Two heads of 8 rows of 3 elements (row r: r * 10 + column).
        let rows: Vec<u32> = (0..16)
            .flat_map(|r| (0..3).map(move |c| r * 10 + c))
            .collect();
        let first = |v: &[u32]| v.chunks(3).map(|r| r[0] / 10).collect::<Vec<_>>();
        let full = pairs_adjacent(&rows, 3, 8, 8);
        assert_eq!(
            first(&full),
            [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
        );
        assert!(full.chunks(3).all(|r| r[1] == r[0] + 1 && r[2] == r[0] + 2));
        let partial = pairs_adjacent(&rows, 3, 8, 4);
        assert_eq!(
            first(&partial),
            [0, 2, 1, 3, 4, 5, 6, 7, 8, 10, 9, 11, 12, 13, 14, 15]
        );
        let on = GpuOptions::default();
        let off = GpuOptions {
            fuse: false,
            ..GpuOptions::default()
        };
        for (shape, want) in [
            ("gpt-oss-tiny", true),
            ("phi3-tiny", true),
            ("qwen2-tiny", true),
            ("qwen3-tiny", false),
            ("gemma3-tiny", false),
            ("tiny", false),
        ] {
            let model = synth(shape, GgmlType::F16);
            assert_eq!(neox_pairs_adjacent(&on, model.hparams()), want, "{shape}");
            assert!(
                !neox_pairs_adjacent(&off, model.hparams()),
                "{shape}: fuse off"
            );
        }
    }

    /// Which experts are packed, what the memory plan counts for them, and
    /// which kernel modules load: qwen3moe's and Mixtral's experts packed
    /// (their packed GEMV module loaded), gpt-oss's (MXFP4, biased) too,
    /// not with `fuse` or `packed` off, and never the router.
    #[test]
    fn experts_are_packed_where_their_gemv_takes_them() {
        for (shape, ty, want) in [
            ("qwen3moe-tiny", GgmlType::Q4_0, true),
            ("qwen3moe-tiny", GgmlType::Q8_0, true),
            ("mixtral-tiny", GgmlType::Q4_0, true),
            ("gpt-oss-tiny", GgmlType::MXFP4, true),
        ] {
            let model = synth(shape, ty);
            let hp = model.hparams();
            let off = |f: fn(&mut GpuOptions)| {
                let mut o = GpuOptions::default();
                f(&mut o);
                o
            };
            let on = GpuOptions::default();
            let mut experts = 0;
            for (name, _) in hp.expected_tensors() {
                let Some(t) = model.file().tensor_info(&name) else {
                    continue;
                };
                let what = format!("{shape} {ty} {name}");
                if name.ends_with("ffn_gate_inp.weight") {
                    assert!(in_rows(&on, hp, t), "{what}: the router stays in rows");
                    continue;
                }
                if t.shape.len() != 3 {
                    continue;
                }
                experts += 1;
                assert_eq!(experts_packed(&on, hp, t), want, "{what}");
                assert_eq!(in_rows(&on, hp, t), !want, "{what}");
                assert!(
                    !experts_packed(&off(|o| o.fuse = false), hp, t),
                    "{what}: fuse off"
                );
                assert!(
                    !experts_packed(&off(|o| o.packed = false), hp, t),
                    "{what}: packed off"
                );
                let f = PackFormat::of(t.ty);
                let bytes = device_bytes(&on, hp, t);
                match (want, f) {
                    (true, Some(f)) => {
                        assert_eq!(
                            bytes,
                            f.packed_bytes(t.n_rows(), t.row_len()) as u64,
                            "{what}"
                        )
                    }
                    _ => assert_eq!(bytes, t.n_bytes, "{what}"),
                }
            }
            assert!(experts >= 3, "{shape}: {experts} experts tensors");
            let modules = modules_needed(&model, &on);
            if want {
                let sym = KernelFormat::of(ty, "test").unwrap().symbol;
                let m = format!("gemv_packed.{sym}");
                assert!(
                    modules.iter().any(|x| *x == m),
                    "{shape}: {m} in {modules:?}"
                );
            }
        }
    }
}
