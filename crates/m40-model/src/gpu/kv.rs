//! The GPU's paged KV cache: one pool of pages per layer for K and one for
//! V (KV_PAGE tokens a page, in the pool's format: the layout of
//! kernels/attention.cuh and kernels/kvq.cuh).
//! Which pages a sequence holds is `crate::paged`'s accounting.

use m40_device::{DeviceBuffer, Stream};
use m40_kernels::KV_PAGE;

use crate::error::Result;
pub use crate::paged::PagePool;
use crate::KvLayout;

/// A sequence's KV cache on the GPU: pages of the backend's pool.
pub type GpuCache = crate::paged::PagedCache;

/// The K and V pages of every layer on the device.
pub(super) struct Pools {
    pub(super) k: Vec<DeviceBuffer<u16>>,
    pub(super) v: Vec<DeviceBuffer<u16>>,
    /// 16-bit words per page of one layer's K (or V).
    page_len: usize,
}

impl Pools {
    /// `n_pages` pages of `layout` (held as 16-bit words: a half, or two
    /// bytes of a quantized page).
    pub(super) fn new(stream: &Stream, layout: KvLayout, n_pages: usize) -> Result<Pools> {
        assert_eq!(layout.page_tokens, KV_PAGE, "the attention kernels' page");
        let page_len = (layout.format.bytes(layout.page_values()) / 2) as usize;
        debug_assert_eq!(
            2 * page_len,
            super::kv_type(layout.format).page_bytes(layout.kv_dim),
            "the kernels' page"
        );
        let pool = |what: &str| -> Result<Vec<DeviceBuffer<u16>>> {
            (0..layout.n_layer)
                .map(|_| Ok(stream.alloc::<u16>(n_pages * page_len, what)?))
                .collect()
        };
        Ok(Pools {
            k: pool("KV cache (K)")?,
            v: pool("KV cache (V)")?,
            page_len,
        })
    }

    /// Copy page `from` to page `to` in every layer (stream-ordered).
    pub(super) fn copy_page(&mut self, stream: &Stream, from: u32, to: u32) -> Result<()> {
        let (n, a, b) = (self.page_len, from as usize, to as usize);
        for pool in self.k.iter_mut().chain(self.v.iter_mut()) {
            stream.copy_device_within(pool, a * n..(a + 1) * n, b * n)?;
        }
        Ok(())
    }
}
