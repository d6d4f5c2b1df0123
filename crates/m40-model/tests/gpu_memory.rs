//! The GPU backend's memory: a KV pool the device has no room for is a
//! clear error before anything is allocated, and a pool with a minimum
//! (an engine's default) takes the whole pages that fit the budget. Every
//! test needs a GPU: the harness lists them as ignored without
//! `--include-ignored`, and with it they fail where there is none.

mod gpu_common;

use gpu_common::{synth, tokens};

use m40_device::testing::gpu_device;
use m40_gguf::GgmlType;
use m40_model::gpu::{GpuBackend, GpuOptions};
use m40_model::{Backend, Logits, ModelError};

/// A KV pool larger than the GPU is refused before anything is allocated,
/// with the sizes in the message.
#[test]
#[ignore = "needs a GPU"]
fn too_little_gpu_memory_is_a_clear_error() {
    let dev = gpu_device("too_little_gpu_memory_is_a_clear_error");
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny", GgmlType::Q4_0);
    let used = dev.budget_used();
    let err = GpuBackend::new(
        dev.clone(),
        model,
        GpuOptions {
            kv_tokens: 1 << 30,
            ..Default::default()
        },
    )
    .err()
    .expect("a 1G-token KV cache does not fit");
    let msg = err.to_string();
    assert!(matches!(err, ModelError::GpuMemory { .. }), "{msg}");
    assert!(msg.contains("KV cache for 1073741824 tokens"), "{msg}");
    // And what would fit: some thousands of tokens of this tiny model.
    assert!(
        msg.contains("tokens fits (of the 1073741824 asked)"),
        "{msg}"
    );
    assert_eq!(dev.budget_used(), used, "nothing was allocated");
}

/// With `kv_min_tokens`, a pool larger than the device's budget shrinks to
/// the whole pages that fit it (an engine's default pool), and runs; below
/// the minimum it is the error above.
#[test]
#[ignore = "needs a GPU"]
fn a_pool_with_a_minimum_takes_what_fits_the_budget() {
    gpu_device("a_pool_with_a_minimum_takes_what_fits_the_budget");
    // A budget of 1% of the free memory (~0.7-1.4 GiB on an H100 or H200).
    let dev = m40_device::Device::open_with(
        0,
        m40_device::DeviceOptions {
            memory_share: 0.01,
            ..Default::default()
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny", GgmlType::Q8_0);
    let asked = 1 << 30;
    let opts = |min| GpuOptions {
        kv_tokens: asked,
        kv_min_tokens: Some(min),
        max_batch: 64,
        ..Default::default()
    };
    let err = GpuBackend::new(dev.clone(), model.clone(), opts(asked / 2))
        .err()
        .expect("half a 1G-token pool does not fit 1% of the GPU");
    assert!(matches!(err, ModelError::GpuMemory { .. }), "{err}");
    assert_eq!(dev.budget_used(), 0, "nothing was allocated");

    let g = GpuBackend::new(dev.clone(), model.clone(), opts(1024)).unwrap();
    let (layout, pages) = g.kv_pool();
    let page = layout.page_tokens;
    assert!((1024..asked).contains(&(page * pages)), "{pages} pages");
    assert!(dev.budget_used() <= dev.budget_limit());
    // What it reports holding (`/api/ps`'s size) is what it allocated.
    let mem = g.memory();
    assert!(mem.on_device);
    assert_eq!(mem.total(), dev.budget_used() as u64, "{mem:?}");
    // One more page would not have fitted beside the headroom: the pool is
    // the most there was room for, and what the backend allocated is what
    // it counted.
    let per_page = {
        let hp = model.hparams();
        (2 * hp.n_layer * page * hp.n_head_kv * hp.head_dim * 2) as u64
    };
    let left = dev.budget_left() as u64;
    let headroom = m40_model::gpu::KV_FIT_HEADROOM;
    assert!(
        (headroom..headroom + 2 * per_page).contains(&left),
        "{left} bytes left, a page is {per_page}"
    );
    // And it runs: the same logits as a small pool's.
    let small = GpuBackend::new(
        gpu_device("a small pool"),
        model.clone(),
        GpuOptions {
            kv_tokens: 256,
            max_batch: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let n_vocab = model.hparams().n_vocab;
    let toks = tokens(40, n_vocab, 7);
    let mut a = g.new_cache(256).unwrap();
    let mut b = small.new_cache(256).unwrap();
    let got = g.forward(&mut a, &toks, Logits::All).unwrap();
    let want = small.forward(&mut b, &toks, Logits::All).unwrap();
    assert_eq!(got, want);
}

/// `memory_limit` caps the plan as a smaller device would: the pool shrinks
/// to the whole pages that fit it (with a minimum) and what the backend
/// holds stays within it; without a minimum, a pool that does not fit is
/// the error, before anything is allocated.
#[test]
#[ignore = "needs a GPU"]
fn a_memory_limit_caps_the_plan() {
    let dev = gpu_device("a_memory_limit_caps_the_plan");
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny", GgmlType::Q8_0);
    let opts = |kv_tokens, min, limit| GpuOptions {
        kv_tokens,
        kv_min_tokens: min,
        max_batch: 64,
        memory_limit: limit,
        ..Default::default()
    };
    // A pool of 1M tokens (~1 GiB), far above the fit's headroom.
    let asked = 1 << 20;
    let full = GpuBackend::new(dev.clone(), model.clone(), opts(asked, None, None)).unwrap();
    let whole = full.memory().total();
    drop(full);
    let before = dev.budget_used();
    let limit = whole / 2;
    let err = GpuBackend::new(dev.clone(), model.clone(), opts(asked, None, Some(limit)))
        .err()
        .expect("the whole pool does not fit half its memory");
    assert!(matches!(err, ModelError::GpuMemory { .. }), "{err}");
    assert!(err.to_string().contains("memory limit"), "{err}");
    assert_eq!(dev.budget_used(), before, "nothing was allocated");
    let g = GpuBackend::new(
        dev.clone(),
        model.clone(),
        opts(asked, Some(256), Some(limit)),
    )
    .unwrap();
    let mem = g.memory();
    let (layout, pages) = g.kv_pool();
    println!(
        "limit {limit}: {} of {} KV tokens, {} bytes",
        layout.page_tokens * pages,
        asked,
        mem.total()
    );
    assert!(mem.total() <= limit, "{mem:?} within {limit}");
    assert!((256..asked).contains(&(layout.page_tokens * pages)));
}
