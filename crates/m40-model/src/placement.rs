//! Where a model's layers run: the placement planner. Each GPU given gets
//! a run of consecutive layers, in proportion to its share (its room, or
//! `--tensor-split`), and the CPU the first layers that do not fit (at most
//! `--gpu-layers` run on GPUs). The embedding goes with the first layer (a
//! gather: on the CPU it costs nothing), the output norm and matrix with the
//! last (the step's largest matmul: on a GPU wherever any layer is). The
//! costs are the backends' own memory plans ([`Costs`]: `gpu::costs`,
//! `cpu::costs`); the KV pool is the same number of tokens in every stage
//! (one block table serves them all), the most that fits down to the
//! minimum asked; more layers on the GPUs win over a larger pool.

use std::fmt;
use std::ops::Range;

use crate::error::{ModelError, Result};
pub use crate::host::available_memory;
use crate::host::human_bytes;
use crate::KvFormat;

/// What a model's parts take on one kind of device, bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Costs {
    /// Each layer's weights.
    pub layers: Vec<u64>,
    /// One layer's K and V for one token.
    pub kv_token: u64,
    /// The token embedding, where it runs with the first layer.
    pub first: u64,
    /// The output norm and matrix (and a tied embedding), with the last.
    pub last: u64,
    /// A stage's workspace (activations, scratch) whatever its layers.
    pub fixed: u64,
    /// Bytes counted in both `first` and `last` (a tied embedding, which
    /// is the output matrix too): once where one stage holds both ends.
    pub both: u64,
}

impl Costs {
    /// Bytes `layers` of a model of `n_layer` take with a pool of `tokens`:
    /// (weights, KV pool, workspace).
    pub fn of(&self, layers: &Range<usize>, tokens: usize) -> (u64, u64, u64) {
        let mut w: u64 = self.layers[layers.clone()].iter().sum();
        if layers.start == 0 {
            w += self.first;
        }
        if layers.end == self.layers.len() {
            w += self.last;
            if layers.start == 0 {
                w -= self.both;
            }
        }
        let kv = self.kv_token * tokens as u64 * layers.len() as u64;
        (w, kv, self.fixed)
    }
}

/// Where a stage runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Gpu(usize),
    Cpu,
}

/// A device the planner may use: how much, and its share of the GPU layers.
#[derive(Clone, Debug, PartialEq)]
pub struct Room {
    pub place: Place,
    /// The device's name, for the printed placement.
    pub name: String,
    /// The bytes the plan may take on it (free memory less headroom, or
    /// `--max-vram` where smaller; the CPU's available memory).
    pub bytes: u64,
    /// Its share of the GPU layers (`--tensor-split`, or its room).
    pub share: f64,
}

/// What to place.
#[derive(Clone, Debug, PartialEq)]
pub struct Ask {
    /// KV tokens wanted (over all sequences together).
    pub kv_tokens: usize,
    /// Where given, the pool may shrink to this many (in whole pages).
    pub min_kv_tokens: Option<usize>,
    /// Tokens a page holds.
    pub page: usize,
    /// Layers on GPUs at most (`--gpu-layers`, Ollama's `num_gpu`).
    pub gpu_layers: Option<usize>,
    pub kv_format: KvFormat,
}

/// One stage of a placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub place: Place,
    pub name: String,
    pub layers: Range<usize>,
    pub weights: u64,
    pub kv: u64,
    pub work: u64,
    /// What the plan could use there.
    pub room: u64,
}

/// Where each layer runs, and the KV pool's tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub n_layer: usize,
    pub kv_tokens: usize,
    pub kv_format: KvFormat,
    /// In layer order: the CPU's (if any) first, then each GPU's.
    pub stages: Vec<Planned>,
}

impl Placement {
    /// Layers on GPUs.
    pub fn gpu_layers(&self) -> usize {
        self.stages
            .iter()
            .filter(|s| s.place != Place::Cpu)
            .map(|s| s.layers.len())
            .sum()
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "placement: {} of {} layers on GPUs, KV cache {} tokens ({})",
            self.gpu_layers(),
            self.n_layer,
            self.kv_tokens,
            self.kv_format.name()
        )?;
        for s in &self.stages {
            let span = crate::Span {
                layers: s.layers.clone(),
                n_layer: self.n_layer,
            };
            writeln!(
                f,
                "  {:<28} {:<32} {} ({} weights, {} KV, {} work) of {}",
                s.name,
                span.describe(),
                human_bytes(s.weights + s.kv + s.work),
                human_bytes(s.weights),
                human_bytes(s.kv),
                human_bytes(s.work),
                human_bytes(s.room)
            )?;
        }
        Ok(())
    }
}

/// Whether `layers` fit `room` with `tokens` of KV cache.
fn fits(c: &Costs, layers: &Range<usize>, tokens: usize, room: u64) -> bool {
    let (w, kv, work) = c.of(layers, tokens);
    w + kv + work <= room
}

/// The layers `range` over `gpus` in proportion to their shares (each a
/// run of consecutive layers; a GPU whose share rounds to none gets none),
/// moved a layer at a time to a neighbour with room where one has none;
/// None where they cannot all fit.
fn assign(
    c: &Costs,
    range: Range<usize>,
    gpus: &[Room],
    tokens: usize,
) -> Option<Vec<Range<usize>>> {
    let total: f64 = gpus.iter().map(|g| g.share.max(0.0)).sum();
    if range.is_empty() || gpus.is_empty() || total <= 0.0 {
        return None;
    }
    let n = range.len();
    // Boundaries at the shares' cumulative fractions.
    let mut bounds = vec![range.start];
    let mut acc = 0.0;
    for g in gpus {
        acc += g.share.max(0.0);
        bounds.push(range.start + ((acc / total) * n as f64).round() as usize);
    }
    *bounds.last_mut().expect("bounds") = range.end;
    let over = |b: &[usize], i: usize| !fits(c, &(b[i]..b[i + 1]), tokens, gpus[i].bytes);
    for _ in 0..2 * n * gpus.len() {
        let Some(i) = (0..gpus.len()).find(|&i| over(&bounds, i)) else {
            return Some(bounds.windows(2).map(|w| w[0]..w[1]).collect());
        };
        // Give a layer to the neighbour that still fits with it.
        let mut moved = false;
        if i > 0 && bounds[i] < bounds[i + 1] {
            let mut b = bounds.clone();
            b[i] += 1;
            if !over(&b, i - 1) {
                bounds = b;
                moved = true;
            }
        }
        if !moved && i + 1 < gpus.len() && bounds[i] < bounds[i + 1] {
            let mut b = bounds.clone();
            b[i + 1] -= 1;
            if !over(&b, i + 1) {
                bounds = b;
                moved = true;
            }
        }
        if !moved {
            return None;
        }
    }
    None
}

/// The placement of a model of `gpu.layers.len()` layers over `gpus` and
/// `cpu` (see the module's documentation); an error with the numbers when
/// even all of them together cannot hold it.
pub fn plan(gpu: &Costs, cpu: &Costs, gpus: &[Room], host: &Room, ask: &Ask) -> Result<Placement> {
    let n = gpu.layers.len();
    let most = ask.gpu_layers.unwrap_or(n).min(n);
    let most = if gpus.is_empty() { 0 } else { most };
    let page = ask.page.max(1);
    let asked = ask.kv_tokens.div_ceil(page) * page;
    let least = match ask.min_kv_tokens {
        Some(m) => m.div_ceil(page).max(1) * page,
        None => asked,
    }
    .min(asked);
    // Every stage fits with `tokens`: the stages, else None.
    let stages_for = |g: usize, tokens: usize| -> Option<Vec<Planned>> {
        let mut out = Vec::new();
        let cpu_layers = 0..n - g;
        if !cpu_layers.is_empty() {
            if !fits(cpu, &cpu_layers, tokens, host.bytes) {
                return None;
            }
            out.push(planned(cpu, host, cpu_layers, tokens));
        }
        if g > 0 {
            let runs = assign(gpu, n - g..n, gpus, tokens)?;
            for (room, layers) in gpus.iter().zip(runs).filter(|(_, l)| !l.is_empty()) {
                out.push(planned(gpu, room, layers, tokens));
            }
        }
        Some(out)
    };
    for g in (0..=most).rev() {
        // The largest pool in whole pages from `least` to `asked` that fits
        // (fitting shrinks as the pool grows).
        if stages_for(g, least).is_none() {
            continue;
        }
        let (mut lo, mut hi) = (least / page, asked / page);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            match stages_for(g, mid * page) {
                Some(_) => lo = mid,
                None => hi = mid - 1,
            }
        }
        let tokens = lo * page;
        let stages = stages_for(g, tokens).expect("fits");
        return Ok(Placement {
            n_layer: n,
            kv_tokens: tokens,
            kv_format: ask.kv_format,
            stages,
        });
    }
    Err(refusal(gpu, cpu, gpus, host, least))
}

fn planned(c: &Costs, room: &Room, layers: Range<usize>, tokens: usize) -> Planned {
    let (weights, kv, work) = c.of(&layers, tokens);
    Planned {
        place: room.place,
        name: room.name.clone(),
        layers,
        weights,
        kv,
        work,
        room: room.bytes,
    }
}

/// Why nothing fits: what the whole model takes with the smallest pool, and
/// what each device has.
fn refusal(gpu: &Costs, cpu: &Costs, gpus: &[Room], host: &Room, tokens: usize) -> ModelError {
    let all = 0..gpu.layers.len();
    let (w, kv, work) = cpu.of(&all, tokens);
    let (gw, gkv, gwork) = gpu.of(&all, tokens);
    let mut have: Vec<String> = gpus
        .iter()
        .map(|g| format!("{} {}", g.name, human_bytes(g.bytes)))
        .collect();
    have.push(format!("{} {}", host.name, human_bytes(host.bytes)));
    ModelError::Placement {
        need: format!(
            "{} on the CPU ({} weights, {} KV cache for {tokens} tokens, {} activations), {} on GPUs",
            human_bytes(w + kv + work),
            human_bytes(w),
            human_bytes(kv),
            human_bytes(work),
            human_bytes(gw + gkv + gwork)
        ),
        have: have.join(", "),
        hint: "use a smaller quantization or context, or more GPUs (--gpus)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// An 8B-like model: 32 layers of 110 MiB (Q4_0), 128 KiB of KV a token
    /// over all layers (4 KiB a layer), a 290 MiB embedding, a 290 MiB
    /// output, 400 MiB of workspace.
    fn costs() -> Costs {
        Costs {
            layers: vec![110 << 20; 32],
            kv_token: 4 << 10,
            first: 290 << 20,
            last: 290 << 20,
            fixed: 400 << 20,
            both: 0,
        }
    }

    fn gpu(i: usize, gib: u64) -> Room {
        Room {
            place: Place::Gpu(i),
            name: format!("GPU {i}"),
            bytes: gib * GIB,
            share: gib as f64,
        }
    }

    fn host(gib: u64) -> Room {
        Room {
            place: Place::Cpu,
            name: "CPU".into(),
            bytes: gib * GIB,
            share: 0.0,
        }
    }

    fn ask(tokens: usize, min: Option<usize>) -> Ask {
        Ask {
            kv_tokens: tokens,
            min_kv_tokens: min,
            page: 32,
            gpu_layers: None,
            kv_format: KvFormat::F16,
        }
    }

    fn layers(p: &Placement) -> Vec<(Place, Range<usize>)> {
        p.stages
            .iter()
            .map(|s| (s.place, s.layers.clone()))
            .collect()
    }

    #[test]
    fn a_model_that_fits_one_gpu_goes_there_whole() {
        let c = costs();
        let p = plan(&c, &c, &[gpu(0, 24)], &host(64), &ask(65536, None)).unwrap();
        assert_eq!(layers(&p), vec![(Place::Gpu(0), 0..32)]);
        assert_eq!(p.kv_tokens, 65536);
        let s = &p.stages[0];
        // 32 x 110 MiB + both ends, 8 GiB of KV, the workspace.
        assert_eq!(s.weights, (32 * 110 + 580) << 20);
        assert_eq!(s.kv, 8 * GIB);
        assert!(p.to_string().contains("32 of 32 layers on GPUs"), "{p}");
    }

    #[test]
    fn gpus_share_the_layers_in_proportion() {
        let c = costs();
        let two = [gpu(0, 24), gpu(1, 24)];
        let p = plan(&c, &c, &two, &host(64), &ask(8192, None)).unwrap();
        assert_eq!(
            layers(&p),
            vec![(Place::Gpu(0), 0..16), (Place::Gpu(1), 16..32)]
        );
        // --tensor-split 3,1.
        let mut split = two.clone();
        split[0].share = 3.0;
        split[1].share = 1.0;
        let p = plan(&c, &c, &split, &host(64), &ask(8192, None)).unwrap();
        assert_eq!(
            layers(&p),
            vec![(Place::Gpu(0), 0..24), (Place::Gpu(1), 24..32)]
        );
        // A share of none: that GPU gets nothing.
        split[1].share = 0.0;
        let p = plan(&c, &c, &split, &host(64), &ask(8192, None)).unwrap();
        assert_eq!(layers(&p), vec![(Place::Gpu(0), 0..32)]);
    }

    #[test]
    fn a_gpu_over_its_room_hands_layers_to_its_neighbour() {
        let c = costs();
        // Equal shares, but GPU 1 has 2.5 GiB: 16 layers (1.7 GiB) and the
        // output and workspace (0.7 GiB) and the KV do not fit, so GPU 0
        // takes layers from it.
        let mut two = [gpu(0, 24), gpu(1, 24)];
        two[1].bytes = 5 * GIB / 2;
        let p = plan(&c, &c, &two, &host(64), &ask(8192, None)).unwrap();
        let l = layers(&p);
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].1.start, 0);
        assert!(l[0].1.end > 16, "{p}");
        for s in &p.stages {
            assert!(s.weights + s.kv + s.work <= s.room, "{p}");
        }
    }

    #[test]
    fn what_the_gpus_cannot_hold_runs_first_on_the_cpu() {
        let c = costs();
        // 2 GiB: the output, the workspace and some layers.
        let p = plan(&c, &c, &[gpu(0, 2)], &host(64), &ask(4096, None)).unwrap();
        let l = layers(&p);
        assert_eq!(l[0].0, Place::Cpu);
        assert_eq!(l[0].1.start, 0);
        assert_eq!(l[1].0, Place::Gpu(0));
        assert_eq!(l[1].1.end, 32);
        let g = &p.stages[1];
        assert!(g.weights + g.kv + g.work <= 2 * GIB);
        // One more layer would not fit.
        let more = l[1].1.start - 1..32;
        assert!(!fits(&c, &more, 4096, 2 * GIB));
        // --gpu-layers caps them.
        let mut a = ask(4096, None);
        a.gpu_layers = Some(4);
        let p = plan(&c, &c, &[gpu(0, 24)], &host(64), &a).unwrap();
        assert_eq!(
            layers(&p),
            vec![(Place::Cpu, 0..28), (Place::Gpu(0), 28..32)]
        );
        a.gpu_layers = Some(0);
        let p = plan(&c, &c, &[gpu(0, 24)], &host(64), &a).unwrap();
        assert_eq!(layers(&p), vec![(Place::Cpu, 0..32)]);
    }

    #[test]
    fn the_pool_shrinks_before_layers_leave_the_gpus() {
        let c = costs();
        // 8 GiB: the weights (4.3 GiB) and the workspace leave ~3.3 GiB for
        // KV: not the 64K tokens asked (8 GiB), but 26K fit.
        let p = plan(&c, &c, &[gpu(0, 8)], &host(64), &ask(65536, Some(4096))).unwrap();
        assert_eq!(p.gpu_layers(), 32);
        assert!(p.kv_tokens >= 4096 && p.kv_tokens < 65536, "{p}");
        assert_eq!(p.kv_tokens % 32, 0);
        let s = &p.stages[0];
        assert!(s.weights + s.kv + s.work <= s.room);
        let one_more = c.of(&(0..32), p.kv_tokens + 32);
        assert!(one_more.0 + one_more.1 + one_more.2 > s.room);
    }

    #[test]
    fn a_model_too_large_for_the_box_is_refused_with_the_numbers() {
        let c = costs();
        let e = plan(&c, &c, &[gpu(0, 1)], &host(2), &ask(4096, None)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("GPU 0 1.00 GiB"), "{m}");
        assert!(m.contains("CPU 2.00 GiB"), "{m}");
        assert!(m.contains("4.89 GiB on the CPU"), "{m}");
        assert!(m.contains("4096 tokens"), "{m}");
    }
}
