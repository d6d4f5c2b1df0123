//! A mixture-of-experts FFN on the device (qwen3moe, Mixtral, gpt-oss):
//! routing on the device, the chosen experts' GEMVs by id.

use m40_device::{DeviceBuffer, DeviceView, Stream};
use m40_gguf::HyperParams;
use m40_kernels::{
    moe_tile_bound, CombineFold, ExpertGlu, ExpertTiles, GemmOpts, MoeShape, PackFormat,
    PackedMatrix, QMatrix, RouterNorm, RouterRoute, RowSplit, MOE_GEMM_TILES, MOE_GEMV_TILE,
};

use super::residual::{Input, Residual};
use super::tuning::{MOE_GEMM_ROWS, MOE_GEMV_GROUP_SLOTS, MOE_GROUP_ROWS, MOE_ROUTER_MAX_TOKENS};
use super::weights::{Experts, GluBias, Mat, MatView, MoeMats};
use super::GpuBackend;
use crate::error::{ModelError, Result};

impl GpuBackend {
    /// A mixture of experts over the `n` normed rows h ([`MoeMats`]): the
    /// router's logits, each token's experts chosen on the device, the
    /// chosen experts' gate and up GEMVs with the gate's activation (one
    /// launch for every token's experts where they are interleaved), their down GEMVs, and
    /// each token's weighted sum into `proj`, left pending (the next norm
    /// adds it to x). gpt-oss's biases join the launches: the router's in
    /// the routing, the gate's and up's in the GEMV's activation (or
    /// `moe_glu`), the down's in the weighted sum. With the FFN norm's
    /// weight in `norms.0` (see [`Self::router_fused`]), `io.h` is not
    /// normed yet: the router's launch writes it. With the next norm's in
    /// `norms.1` (one token), the weighted sum is added to x and emits
    /// that norm folded (`moe_combine_fold`: h and the partial sums) for
    /// the next GEMVs.
    pub(super) fn moe_ffn(
        &self,
        layer: usize,
        mats: &MoeMats,
        io: MoeIo<'_>,
        norms: (Option<&DeviceBuffer<f32>>, Option<&DeviceBuffer<f32>>),
        b: &mut MoeBufs,
        n: usize,
    ) -> Result<Residual<'static>> {
        let MoeIo { x, h, part, proj } = io;
        let (norm, next_norm) = norms;
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture's layer");
        let shape = MoeShape {
            n,
            k: m.n_expert_used,
        };
        // gpt-oss's biases, as views.
        let router_view = mats.bias.as_ref().map(|b| b.router.view());
        let router_b = router_view.as_ref();
        let data = mats.router.data.view();
        match mats.router.view(&data) {
            // One token through an F32 router: a block a row, the last
            // routing (moe_router), with the FFN norm where `norm` says.
            MatView::Rows(q) if self.router_fused(mats, n) => {
                let route = RouterRoute {
                    done: &mut b.done,
                    bias: router_b,
                    ids: &mut b.ids,
                    w: &mut b.w,
                    k: shape.k,
                };
                match norm {
                    Some(weight) => {
                        let weight = weight.view();
                        let rn = RouterNorm {
                            weight: &weight,
                            eps: hp.rms_eps,
                            h: &mut *h,
                        };
                        k.moe_router(s, &q, &x.view(), &mut b.logits, Some(rn), Some(route))?
                    }
                    None => k.moe_router(s, &q, &h.view(), &mut b.logits, None, Some(route))?,
                }
            }
            router => {
                debug_assert!(norm.is_none(), "the norm rides on the fused router only");
                match router {
                    // Several tokens through an F32 router: a block a row
                    // and 8 tokens.
                    MatView::Rows(q) if n <= MOE_ROUTER_MAX_TOKENS && k.moe_router_takes(&q) => {
                        k.moe_router_tokens(s, &q, &h.view(), &mut b.logits, n)?
                    }
                    _ => self.matmul(
                        &mats.router,
                        Input::Rows(&h.view()),
                        &mut b.logits,
                        n,
                        false,
                    )?,
                }
                k.moe_route(
                    s,
                    &b.logits.view(),
                    router_b,
                    m.n_expert,
                    shape,
                    &mut b.ids,
                    &mut b.w,
                )?;
            }
        }
        let hin = h.view();
        let hv = &hin;
        let down_view = mats.bias.as_ref().map(|b| b.down.view());
        if let Some(cap) = self.expert_gemm_cap(mats, n) {
            self.moe_gemms(layer, mats, hv, b, shape, cap)?;
            let ids = b.ids.view();
            let down_b = down_view.as_ref().map(|db| (&ids, db));
            k.moe_combine(s, &b.y.view(), &b.w.view(), down_b, proj, hp.n_embd, shape)?;
            return Ok(Residual::PENDING);
        }
        if self.groups_experts(mats, n)? {
            self.moe_grouped(mats, hv, b, shape)?;
            k.moe_combine(s, &b.y.view(), &b.w.view(), None, proj, hp.n_embd, shape)?;
            return Ok(Residual::PENDING);
        }
        // Two or more tokens (`group_experts`) of at least
        // MOE_GEMV_GROUP_SLOTS slots an expert on average: their slots
        // grouped by expert on the device, so that the packed GEMVs read an
        // expert once for up to 8 of its slots (one token's slots are its
        // distinct experts already).
        let slots = n * shape.k;
        let grouped = n >= 2 && self.group_experts && slots >= MOE_GEMV_GROUP_SLOTS * m.n_expert;
        if grouped {
            k.moe_tiles(
                s,
                &b.ids.slice(0..slots)?,
                m.n_expert,
                MOE_GEMV_TILE,
                &mut b.order,
                &mut b.tiles,
                Some((&mut b.seen, layer)),
            )?;
        }
        let (order, tiles) = (b.order.slice(0..slots)?, b.tiles.view());
        let tiles = grouped.then_some(ExpertTiles {
            order: &order,
            tiles: &tiles,
            cap: MOE_GEMV_TILE,
        });
        let ids = b.ids.view();
        // gpt-oss's gate and up biases: apart (GGUF rows, split gate and
        // up), or in the packed gate/up stack's row order.
        let (apart, rows_b) = match mats.bias.as_ref().map(|b| &b.gate_up) {
            Some(GluBias::Apart([g, u])) => (Some([g.view(), u.view()]), None),
            Some(GluBias::Rows(r)) => (None, Some(r.view())),
            None => (None, None),
        };
        // A matrix's GEMVs for every slot (x row j / x_per), `rows` rows an
        // expert: packed, or in GGUF rows (with gpt-oss's biases).
        let experts = |mat: &Mat,
                       rows: usize,
                       x: &DeviceView<'_, f32>,
                       x_per: usize,
                       y: &mut DeviceBuffer<f32>,
                       glu: Option<ExpertGlu<'_, '_>>|
         -> Result<()> {
            let data = mat.data.view();
            match mat.view(&data) {
                MatView::Packed(p) => {
                    debug_assert!(
                        glu.is_none_or(|g| g.bias.is_none()),
                        "packed experts: biases in the stack's row order"
                    );
                    let act = glu.map(|g| g.act);
                    let bias = act.and(rows_b.as_ref());
                    k.gemv_packed_experts(s, &p, rows, &ids, x, x_per, y, shape, act, bias, tiles)?
                }
                MatView::Rows(q) => k.gemv_experts(s, &q, rows, &ids, x, x_per, y, shape, glu)?,
            }
            Ok(())
        };
        let ff = m.n_ff_exp;
        let gate_up_b = apart.as_ref().map(|[g, u]| [g, u]);
        match &mats.gate_up {
            Experts::Glu(gu) => {
                let glu = ExpertGlu {
                    act: hp.act,
                    bias: gate_up_b,
                };
                experts(gu, 2 * ff, hv, shape.k, &mut b.gate, Some(glu))?;
            }
            Experts::Split(gate, up) => {
                for (mat, out) in [(gate, &mut b.gate), (up, &mut b.up)] {
                    experts(mat, ff, hv, shape.k, out, None)?;
                }
                match gate_up_b {
                    Some(gu) => {
                        k.moe_glu(s, hp.act, &mut b.gate, &b.up.view(), &ids, gu, ff, shape)?
                    }
                    None => k.glu(s, hp.act, &mut b.gate, &b.up.view(), n * shape.k * ff)?,
                }
            }
        }
        let d = hp.n_embd;
        experts(&mats.down, d, &b.gate.view(), 1, &mut b.y, None)?;
        let down_b = down_view.as_ref().map(|db| (&ids, db));
        // One token before a norm whose GEMVs take it folded: the weighted
        // sum joins x here and emits that norm (no launch of its own).
        if let (Some(nw), 1) = (next_norm, n) {
            let nv = nw.view();
            let fold = CombineFold {
                weight: &nv,
                h,
                part,
            };
            let (y, w) = (b.y.view(), b.w.view());
            let parts = k.moe_combine_fold(s, &y, &w, down_b, x, fold, d, shape.k)?;
            return Ok(Residual::Folded(parts));
        }
        k.moe_combine(s, &b.y.view(), &b.w.view(), down_b, proj, d, shape)?;
        Ok(Residual::PENDING)
    }

    /// Whether a step of `n` tokens routes in the router's launch
    /// (`moe_router`: one token, an F32 router it takes, `fuse`); the
    /// caller may then leave the FFN norm to it too.
    pub(super) fn router_fused(&self, mats: &MoeMats, n: usize) -> bool {
        let data = mats.router.data.view();
        self.fuse
            && n == 1
            && matches!(mats.router.view(&data), MatView::Rows(q) if self.kernels.moe_router_takes(&q))
    }

    /// The tile width (slots) for which a step of `n` tokens runs its
    /// experts as grouped GEMMs ([`Self::moe_gemms`]), or None: with
    /// `group_experts`, every expert matrix packed, and at least
    /// MOE_GEMM_ROWS slots an expert on average; tiles of 32 slots (the
    /// narrow tile) up to 32 an expert on average, else 64.
    fn expert_gemm_cap(&self, mats: &MoeMats, n: usize) -> Option<usize> {
        let m = self.model.hparams().moe?;
        let slots = n * m.n_expert_used;
        let packed = |mat: &Mat| {
            mat.packed
                && PackFormat::of(mat.ty)
                    .is_some_and(|f| f.takes_experts(mat.rows / m.n_expert, mat.cols))
        };
        let all_packed = match &mats.gate_up {
            // A stack's biases must be in its row order (packed).
            Experts::Glu(gu) => {
                packed(gu)
                    && !matches!(
                        mats.bias.as_ref().map(|b| &b.gate_up),
                        Some(GluBias::Apart(_))
                    )
            }
            Experts::Split(g, u) => {
                packed(g)
                    && packed(u)
                    && !matches!(
                        mats.bias.as_ref().map(|b| &b.gate_up),
                        Some(GluBias::Rows(_))
                    )
            }
        } && packed(&mats.down);
        let [narrow, large] = MOE_GEMM_TILES;
        (self.group_experts && n >= 2 && all_packed && slots >= MOE_GEMM_ROWS * m.n_expert)
            .then_some(if slots <= narrow * m.n_expert {
                narrow
            } else {
                large
            })
    }

    /// The experts' FFNs of a step's `shape.n` tokens as grouped GEMMs on
    /// the device: the slots grouped by expert in tiles of up to `cap`
    /// (`moe_tiles`), then one launch a matrix for every expert
    /// (`gemm_packed_experts`: each expert's weights read once a tile of
    /// its slots): gate and up (side by side in b.up, then the activation
    /// and gpt-oss's biases into b.gate; or apart into b.gate and b.up),
    /// then down into b.y in slot order, as `moe_combine` reads it. Nothing
    /// read on the host: capturable.
    fn moe_gemms(
        &self,
        layer: usize,
        mats: &MoeMats,
        h: &DeviceView<'_, f32>,
        b: &mut MoeBufs,
        shape: MoeShape,
        cap: usize,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture's layer");
        let (slots, ff) = (shape.n * shape.k, m.n_ff_exp);
        k.moe_tiles(
            s,
            &b.ids.slice(0..slots)?,
            m.n_expert,
            cap,
            &mut b.order,
            &mut b.tiles,
            Some((&mut b.seen, layer)),
        )?;
        let (ids, order, tiles) = (b.ids.view(), b.order.slice(0..slots)?, b.tiles.view());
        let t = ExpertTiles {
            order: &order,
            tiles: &tiles,
            cap,
        };
        let gemm = |mat: &Mat,
                    x: &DeviceView<'_, f32>,
                    x_per: usize,
                    y: &mut DeviceBuffer<f32>|
         -> Result<()> {
            let data = mat.data.view();
            let MatView::Packed(p) = mat.view(&data) else {
                unreachable!("expert_gemm_cap takes packed experts only");
            };
            let rows = mat.rows / m.n_expert;
            Ok(k.gemm_packed_experts(s, &p, rows, &ids, x, x_per, y, slots, t)?)
        };
        let bias = mats.bias.as_ref().map(|b| &b.gate_up);
        match &mats.gate_up {
            Experts::Glu(gu) => {
                gemm(gu, h, shape.k, &mut b.up)?;
                match bias {
                    Some(GluBias::Rows(r)) => {
                        let up = b.up.view();
                        k.moe_glu_pairs(s, hp.act, &up, &mut b.gate, &ids, &r.view(), slots, ff)?
                    }
                    _ => k.glu_pairs(s, hp.act, &b.up.view(), &mut b.gate, slots, ff)?,
                }
            }
            Experts::Split(gate, up) => {
                gemm(gate, h, shape.k, &mut b.gate)?;
                gemm(up, h, shape.k, &mut b.up)?;
                match bias {
                    Some(GluBias::Apart([g, u])) => {
                        let gu = [&g.view(), &u.view()];
                        k.moe_glu(s, hp.act, &mut b.gate, &b.up.view(), &ids, gu, ff, shape)?
                    }
                    _ => k.glu(s, hp.act, &mut b.gate, &b.up.view(), slots * ff)?,
                }
            }
        }
        gemm(&mats.down, &b.gate.view(), 1, &mut b.y)
    }

    /// Whether a step of `n` tokens groups its slots by expert: at least
    /// MOE_GROUP_ROWS slots an expert on average, two or more a token, no expert
    /// biases (gpt-oss keeps the GEMVs), and the stream not being captured
    /// (the grouping reads the routing on the host).
    fn groups_experts(&self, mats: &MoeMats, n: usize) -> Result<bool> {
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture's layer");
        Ok(n * m.n_expert_used >= MOE_GROUP_ROWS * m.n_expert
            && m.n_expert_used >= 2
            && mats.bias.is_none()
            && !self.stream.is_capturing()?)
    }

    /// The experts' FFNs of a step's `shape.n` tokens grouped by expert:
    /// the routing (b.ids) read on the host and the slots ordered by expert
    /// (b.order, and b.inverse back); the tokens' rows gathered in that
    /// order into b.sorted; for each chosen expert one GEMM of gate and up
    /// over its rows, the activation, one GEMM of down, its rows back into
    /// b.sorted; then every slot's output into b.y in slot order, as
    /// `moe_combine` reads it. The same sums as the GEMVs' per row (the
    /// GEMM's), so the logits agree with the CPU's to the usual tolerance.
    pub(super) fn moe_grouped(
        &self,
        mats: &MoeMats,
        h: &DeviceView<'_, f32>,
        b: &mut MoeBufs,
        shape: MoeShape,
    ) -> Result<()> {
        let (k, s) = (&self.kernels, &self.stream);
        let hp = self.model.hparams();
        let m = hp.moe.expect("a mixture's layer");
        let (d, ff, slots) = (hp.n_embd, m.n_ff_exp, shape.n * shape.k);
        let mut ids = vec![0i32; slots];
        s.copy_to_host(&b.ids.slice(0..slots)?, &mut ids)?;
        // Counting sort of the slots by expert (stable: slot order within
        // an expert).
        let mut count = vec![0usize; m.n_expert + 1];
        for &e in &ids {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < m.n_expert)
                .ok_or_else(|| {
                    ModelError::Unsupported(format!("expert id {e} of {} experts", m.n_expert))
                })?;
            count[e + 1] += 1;
        }
        for e in 0..m.n_expert {
            count[e + 1] += count[e];
        }
        let starts = count.clone();
        let mut order = vec![0i32; slots];
        let mut inverse = vec![0i32; slots];
        for (j, &e) in ids.iter().enumerate() {
            let at = &mut count[e as usize];
            order[*at] = j as i32;
            inverse[j] = *at as i32;
            *at += 1;
        }
        s.copy_to_device(&order, &mut b.order)?;
        s.copy_to_device(&inverse, &mut b.inverse)?;
        k.moe_gather(s, h, &b.order.slice(0..slots)?, shape.k, &mut b.sorted, d)?;
        for e in 0..m.n_expert {
            let (off, c) = (starts[e], starts[e + 1] - starts[e]);
            if c == 0 {
                continue;
            }
            let x = b.sorted.slice(off * d..(off + c) * d)?;
            // Expert e's matrix of the 3-D tensor (packed, or in GGUF rows)
            // times its c rows of x.
            let gemm =
                |mat: &Mat, x: &DeviceView<'_, f32>, y: &mut DeviceBuffer<f32>| -> Result<()> {
                    let (rows, cols) = (mat.rows / m.n_expert, mat.cols);
                    let opts = GemmOpts {
                        accumulate: false,
                        scratch: None,
                        splits: None,
                        tile: None,
                    };
                    if mat.packed {
                        let f = PackFormat::of(mat.ty).expect("a packed format");
                        let eb = f.packed_bytes(rows, cols);
                        let part = mat.data.slice(e * eb..(e + 1) * eb)?;
                        let (ty, data) = (mat.ty, &part);
                        let w = PackedMatrix {
                            ty,
                            data,
                            rows,
                            cols,
                        };
                        let out = RowSplit {
                            bufs: &mut [y],
                            rows: &[rows],
                        };
                        return Ok(k.gemm_packed_split(s, &w, x, out, c, opts)?);
                    }
                    let rb = mat.ty.row_bytes(cols as u64).expect("a GGUF row format") as usize;
                    let part = mat.data.slice(e * rows * rb..(e + 1) * rows * rb)?;
                    let (ty, data) = (mat.ty, &part);
                    let w = QMatrix {
                        ty,
                        data,
                        rows,
                        cols,
                    };
                    Ok(k.gemm(s, &w, x, y, c, opts)?)
                };
            match &mats.gate_up {
                Experts::Glu(gu) => {
                    gemm(gu, &x, &mut b.up)?;
                    k.glu_pairs(s, hp.act, &b.up.view(), &mut b.gate, c, ff)?;
                }
                Experts::Split(gate, up) => {
                    gemm(gate, &x, &mut b.gate)?;
                    gemm(up, &x, &mut b.up)?;
                    k.glu(s, hp.act, &mut b.gate, &b.up.view(), c * ff)?;
                }
            }
            gemm(&mats.down, &b.gate.slice(0..c * ff)?, &mut b.y)?;
            s.copy_device_at(&b.y.slice(0..c * d)?, &mut b.sorted, off * d)?;
        }
        k.moe_gather(
            s,
            &b.sorted.view(),
            &b.inverse.slice(0..slots)?,
            1,
            &mut b.y,
            d,
        )?;
        Ok(())
    }
}

/// The workspace's rows a mixture's FFN reads and writes: the residual x,
/// h (the FFN norm's output; with a folded next norm, its h), the folded
/// norm's partial sums, and `proj` (the weighted sum left pending).
pub(super) struct MoeIo<'a> {
    pub(super) x: &'a mut DeviceBuffer<f32>,
    pub(super) h: &'a mut DeviceBuffer<f32>,
    pub(super) part: &'a mut DeviceBuffer<f32>,
    pub(super) proj: &'a mut DeviceBuffer<f32>,
}

/// A mixture of experts' activations for b tokens of k experts each: the
/// router's logits (b, n_expert), the chosen ids and weights (b, k), the
/// experts' gate and up (b k, n_ff_exp) and outputs (b k, n_embd).
pub(super) struct MoeBufs {
    pub(super) logits: DeviceBuffer<f32>,
    pub(super) ids: DeviceBuffer<i32>,
    pub(super) w: DeviceBuffer<f32>,
    pub(super) gate: DeviceBuffer<f32>,
    pub(super) up: DeviceBuffer<f32>,
    pub(super) y: DeviceBuffer<f32>,
    /// A step's slots by expert (`Kernels::moe_tiles`, or
    /// [`GpuBackend::moe_grouped`] on the host): each sorted position's
    /// slot; the device's tiles of them; and for the host's grouping each
    /// slot's sorted position and the tokens' rows in that order (then the
    /// experts' outputs in it).
    pub(super) order: DeviceBuffer<i32>,
    pub(super) tiles: DeviceBuffer<i32>,
    pub(super) inverse: DeviceBuffer<i32>,
    pub(super) sorted: DeviceBuffer<f32>,
    /// The one-token router's count of finished blocks (its last block
    /// routes: `RouterRoute`), zero between launches.
    pub(super) done: DeviceBuffer<u32>,
    /// Per layer, the experts that steps of two or more tokens have read
    /// so far (each step adds its number of experts with a slot).
    pub(super) seen: DeviceBuffer<u64>,
}

/// Floats of [`MoeBufs`] for b tokens (ids counted as floats: 4 bytes).
fn moe_floats(hp: &HyperParams, b: usize) -> [usize; 10] {
    match hp.moe {
        Some(m) => {
            let slots = b * m.n_expert_used;
            // The grouped prefill's buffers where a step can group.
            let grouped = match slots >= MOE_GROUP_ROWS * m.n_expert {
                true => slots,
                false => 1,
            };
            [
                b * m.n_expert,
                slots,
                slots,
                slots * m.n_ff_exp,
                // up: the grouped GEMMs' gate and up side by side.
                2 * slots * m.n_ff_exp,
                slots * hp.n_embd,
                slots,
                // Tiles of 8 (the GEMVs') or more (the GEMMs'): the
                // bound falls as the tiles widen.
                1 + 2 * moe_tile_bound(slots, m.n_expert, MOE_GEMV_TILE),
                grouped,
                grouped * hp.n_embd,
            ]
        }
        None => [1; 10],
    }
}

impl MoeBufs {
    pub(super) fn new(stream: &Stream, hp: &HyperParams, b: usize) -> Result<MoeBufs> {
        let a = |n: usize, what: &str| stream.alloc::<f32>(n.max(1), what);
        let [l, i, w, g, u, y, o, t, inv, sorted] = moe_floats(hp, b);
        Ok(MoeBufs {
            logits: a(l, "expert routing")?,
            ids: stream.alloc::<i32>(i, "expert routing")?,
            w: a(w, "expert routing")?,
            gate: a(g, "expert activations")?,
            up: a(u, "expert activations")?,
            y: a(y, "expert activations")?,
            order: stream.alloc::<i32>(o, "expert routing")?,
            tiles: stream.alloc::<i32>(t, "expert routing")?,
            inverse: stream.alloc::<i32>(inv, "expert routing")?,
            sorted: a(sorted, "expert activations")?,
            done: stream.alloc_zeroed::<u32>(1, "expert routing")?,
            seen: stream.alloc_zeroed::<u64>(hp.n_layer.max(1), "expert routing")?,
        })
    }

    /// Floats (and ids, 4 bytes each; the counts of `seen`, two)
    /// [`MoeBufs::new`] allocates.
    pub(super) fn floats(hp: &HyperParams, b: usize) -> u64 {
        (moe_floats(hp, b).iter().sum::<usize>() + 2 * hp.n_layer.max(1)) as u64
    }
}

impl GpuBackend {
    /// A mixture's experts read so far by its steps of two or more tokens
    /// that group them (`GpuOptions::group_experts`), per layer (each such
    /// step adds its number of distinct experts; one token's step reads
    /// `n_expert_used`, not counted); None for a dense model or where the
    /// steps do not group. Waits for the device.
    pub fn experts_read(&self) -> Result<Option<Vec<u64>>> {
        if self.model.hparams().moe.is_none() || !self.group_experts {
            return Ok(None);
        }
        let st = super::lock(&self.state);
        Ok(Some(self.stream.download(&st.work.moe.seen)?))
    }
}
