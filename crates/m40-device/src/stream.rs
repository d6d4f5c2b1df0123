//! Streams: allocation, asynchronous copies, events, kernel launches.

use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{
    result, sys, CudaEvent, CudaGraph, CudaStream, DevicePtrMut, LaunchArgs, PushKernelArg,
};

use crate::device::Device;
use crate::error::{Ctx, DeviceError, Result};
use crate::memory::{DeviceBuffer, DeviceView, MappedBuffer, PinnedBuffer, TAIL_SLACK};
use crate::module::Kernel;

/// An ordered queue of GPU work. Work on one stream runs in order; use
/// [`Event`]s to order work across streams.
#[derive(Clone)]
pub struct Stream {
    device: Arc<Device>,
    pub(crate) inner: Arc<CudaStream>,
}

/// A point in a stream's work, for ordering and timing.
pub struct Event(CudaEvent);

/// Work recorded from a stream by [`Stream::capture`], replayed with one
/// launch (the kernels' arguments, buffers included, are fixed at capture).
pub struct Graph(CudaGraph);

// SAFETY: CUDA requires calls on one graph to be serialized, not made from
// one thread: Graph is Send (moved, or used under a lock) but not Sync, so no
// two threads reach it at once; launches bind the context to the calling
// thread first.
unsafe impl Send for Graph {}

impl Graph {
    /// Queue one replay on the stream it was captured from.
    ///
    /// # Safety
    /// Every buffer the captured work used must still be allocated: the graph
    /// holds their device addresses, not the buffers (Rust's borrows end with
    /// the capture).
    pub unsafe fn launch(&self) -> Result<()> {
        self.0.launch().ctx("cuGraphLaunch")
    }
}

impl Event {
    /// Milliseconds between `self` and `end` (both recorded with timing).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.0.elapsed_ms(&end.0).ctx("cuEventElapsedTime")
    }

    /// Block the host until the work before this event is done.
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize().ctx("cuEventSynchronize")
    }
}

fn check_len(what: &'static str, len: usize, capacity: usize) -> Result<()> {
    if len != capacity {
        return Err(DeviceError::Size {
            what,
            len,
            capacity,
        });
    }
    Ok(())
}

/// A device's streams (here, so that the device knows nothing of streams).
impl Device {
    /// The stream most work runs on (the context's default stream).
    pub fn stream(self: &Arc<Self>) -> Stream {
        Stream::new(self.clone(), self.ctx.default_stream())
    }

    /// A new stream, independent of the default one.
    pub fn new_stream(self: &Arc<Self>) -> Result<Stream> {
        let s = self.ctx.new_stream().ctx("cuStreamCreate")?;
        Ok(Stream::new(self.clone(), s))
    }
}

impl Stream {
    pub(crate) fn new(device: Arc<Device>, inner: Arc<CudaStream>) -> Self {
        Self { device, inner }
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// Block the host until everything queued on this stream is done, and
    /// report any error a kernel raised.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().ctx("cuStreamSynchronize")
    }

    /// Record an event (with timing) at this point of the stream.
    pub fn record(&self) -> Result<Event> {
        self.inner
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map(Event)
            .ctx("cuEventRecord")
    }

    /// Make later work on this stream wait for `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.inner.wait(&event.0).ctx("cuStreamWaitEvent")
    }

    /// Whether this stream is being captured into a graph (then nothing
    /// may synchronize on it).
    pub fn is_capturing(&self) -> Result<bool> {
        let status = self.inner.capture_status().ctx("cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Record the work `f` queues on this stream into a [`Graph`] instead of
    /// running it. The default stream cannot be captured: use a stream from
    /// [`Device::new_stream`]. Waits for all earlier work on the device first.
    /// Buffers the work uses must outlive the graph's replays and nothing may
    /// allocate or synchronize inside `f`. Other threads may use the device
    /// meanwhile on their own streams; their [`Device::synchronize`] waits for
    /// the capture to end.
    pub fn capture<E: From<DeviceError>>(
        &self,
        f: impl FnOnce(&Stream) -> Result<(), E>,
    ) -> Result<Graph, E> {
        if self.inner.cu_stream().is_null() {
            return Err(DeviceError::Capture(
                "the default stream cannot be captured; use Device::new_stream",
            )
            .into());
        }
        // cudarc's cross-stream tracking makes launches wait on events recorded
        // before the capture, which capture forbids (CUDA_ERROR_STREAM_CAPTURE_
        // ISOLATION). So: finish all earlier work first, then capture with the
        // tracking off; replays are ordered after earlier work on this stream.
        // The guard keeps other threads' synchronizes of this GPU out until
        // the capture ends (they would invalidate it).
        let _capture = self.device.begin_capture()?;
        let ctx = &self.device.ctx;
        let tracking = ctx.is_event_tracking();
        if tracking {
            // SAFETY: no work is pending on any stream (synchronized above), so
            // the waits tracking would add have nothing to wait for; it is
            // switched back on below whatever happens.
            unsafe { ctx.disable_event_tracking() };
        }
        let begun = self
            .inner
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ctx("cuStreamBeginCapture");
        let (body, graph) = match begun {
            Ok(()) => {
                let body = f(self);
                // End the capture whatever `f` did, so the stream is usable again.
                let graph = self
                    .inner
                    .end_capture(sys::CUgraphInstantiate_flags(0))
                    .ctx("cuStreamEndCapture");
                (body, graph)
            }
            Err(e) => (Ok(()), Err(e)),
        };
        if tracking {
            // SAFETY: restores the state found above.
            unsafe { ctx.enable_event_tracking() };
        }
        body?;
        match graph? {
            Some(g) => Ok(Graph(g)),
            None => Err(DeviceError::Capture("nothing was captured").into()),
        }
    }

    /// A buffer of `len` elements whose contents are undefined (write before
    /// reading). `what` names it in an out-of-memory error.
    pub fn alloc<T: Pod>(&self, len: usize, what: &str) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| self.device.oom(what, usize::MAX))?;
        let reserved = bytes + TAIL_SLACK;
        if !self.device.reserve(reserved) {
            return Err(self.device.oom(what, bytes));
        }
        // SAFETY: u8 has no invalid bit patterns; callers get the buffer as
        // "contents undefined", and the kernels or copies that follow write it.
        let raw = unsafe { self.inner.alloc::<u8>(reserved) };
        match raw {
            Ok(raw) => Ok(DeviceBuffer::from_raw(raw, len, &self.device, reserved)),
            Err(e) => {
                self.device
                    .budget
                    .used
                    .fetch_sub(reserved, std::sync::atomic::Ordering::AcqRel);
                Err(match e.0 {
                    sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => self.device.oom(what, bytes),
                    _ => DeviceError::Driver {
                        op: "cuMemAlloc",
                        source: e,
                    },
                })
            }
        }
    }

    /// A buffer of `len` elements, every byte zero.
    pub fn alloc_zeroed<T: Pod>(&self, len: usize, what: &str) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc(len, what)?;
        self.fill_bytes(&mut b, 0)?;
        Ok(b)
    }

    /// Set every byte of `buf` to `byte` (0xFF makes every f32 a NaN: the
    /// poison tests write before a launch).
    pub fn fill_bytes<T: Pod>(&self, buf: &mut DeviceBuffer<T>, byte: u8) -> Result<()> {
        let n = buf.raw.len();
        let (ptr, _sync) = buf.raw.device_ptr_mut(&self.inner);
        // SAFETY: `ptr` addresses `n` bytes owned by `buf`, borrowed mutably
        // for the call; the memset is ordered on this stream.
        unsafe { result::memset_d8_async(ptr, byte, n, self.inner.cu_stream()) }
            .ctx("cuMemsetD8Async")
    }

    /// Allocate and copy `src` to the device.
    pub fn upload<T: Pod>(&self, src: &[T], what: &str) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc(src.len(), what)?;
        self.copy_to_device(src, &mut b)?;
        Ok(b)
    }

    /// Host -> device, into the first `src.len()` elements of `dst` (a longer
    /// `src` is an error). Returns once `src` may be reused; use
    /// [`Self::copy_from_pinned`] for asynchronous copies.
    pub fn copy_to_device<T: Pod>(&self, src: &[T], dst: &mut DeviceBuffer<T>) -> Result<()> {
        if src.len() > dst.len() {
            check_len("host -> device copy", src.len(), dst.len())?;
        }
        if src.is_empty() {
            return Ok(());
        }
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let mut view = dst.raw.slice_mut(0..bytes.len());
        self.inner
            .memcpy_htod(bytes, &mut view)
            .ctx("cuMemcpyHtoDAsync")
    }

    /// Device -> host; returns when the bytes are on the host.
    pub fn copy_to_host<T: Pod>(&self, src: &DeviceView<'_, T>, dst: &mut [T]) -> Result<()> {
        check_len("device -> host copy", dst.len(), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        self.inner
            .memcpy_dtoh(&src.raw, bytes)
            .ctx("cuMemcpyDtoHAsync")?;
        self.synchronize()
    }

    /// Copy a whole buffer to a new Vec.
    pub fn download<T: Pod>(&self, src: &DeviceBuffer<T>) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); src.len()];
        self.copy_to_host(&src.view(), &mut v)?;
        Ok(v)
    }

    /// Device -> device, ordered on this stream.
    pub fn copy_device<T: Pod>(
        &self,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        check_len("device -> device copy", src.len(), dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let n = src.len() * std::mem::size_of::<T>();
        let mut view = dst.raw.slice_mut(0..n);
        self.inner
            .memcpy_dtod(&src.raw, &mut view)
            .ctx("cuMemcpyDtoDAsync")
    }

    /// Device -> device into `dst`'s elements from `at` on, ordered on this
    /// stream.
    pub fn copy_device_at<T: Pod>(
        &self,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceBuffer<T>,
        at: usize,
    ) -> Result<()> {
        let end = at.saturating_add(src.len());
        if end > dst.len() {
            return Err(DeviceError::Size {
                what: "device -> device copy",
                len: end,
                capacity: dst.len(),
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        let sz = std::mem::size_of::<T>();
        let mut view = dst.raw.slice_mut(at * sz..end * sz);
        self.inner
            .memcpy_dtod(&src.raw, &mut view)
            .ctx("cuMemcpyDtoDAsync")
    }

    /// Copy elements `src` of `buf` to its elements from `dst` on (the two
    /// ranges apart), ordered on this stream.
    pub fn copy_device_within<T: Pod>(
        &self,
        buf: &mut DeviceBuffer<T>,
        src: std::ops::Range<usize>,
        dst: usize,
    ) -> Result<()> {
        let n = src.end.saturating_sub(src.start);
        let end = src.end.max(dst + n);
        if end > buf.len() {
            return Err(DeviceError::Size {
                what: "copy within a buffer",
                len: end,
                capacity: buf.len(),
            });
        }
        if n == 0 {
            return Ok(());
        }
        assert!(
            src.end <= dst || dst + n <= src.start,
            "copy within a buffer: {src:?} and {dst}.. overlap"
        );
        let sz = std::mem::size_of::<T>();
        let (s, d, bytes) = (src.start * sz, dst * sz, n * sz);
        if s < d {
            let (lo, mut hi) = buf.raw.split_at_mut(d);
            self.inner
                .memcpy_dtod(&lo.slice(s..s + bytes), &mut hi.slice_mut(0..bytes))
        } else {
            let (mut lo, hi) = buf.raw.split_at_mut(s);
            self.inner
                .memcpy_dtod(&hi.slice(0..bytes), &mut lo.slice_mut(d..d + bytes))
        }
        .ctx("cuMemcpyDtoDAsync")
    }

    /// Pinned host memory that copies run from and to asynchronously.
    pub fn alloc_pinned<T: Pod>(&self, len: usize, what: &str) -> Result<PinnedBuffer<T>> {
        PinnedBuffer::alloc(&self.device, len, 0, what)
    }

    /// Pinned host memory that kernels address directly.
    pub fn alloc_mapped<T: Pod>(&self, len: usize, what: &str) -> Result<MappedBuffer<T>> {
        MappedBuffer::alloc(&self.device, len, what)
    }

    /// Pinned host -> device, asynchronous: returns before the copy is done;
    /// the pinned buffer waits for it before the host touches it again.
    pub fn copy_from_pinned<T: Pod>(
        &self,
        src: &PinnedBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        check_len("pinned -> device copy", src.len(), dst.len())?;
        let n = src.len() * std::mem::size_of::<T>();
        if n == 0 {
            return Ok(());
        }
        let mut view = dst.raw.slice_mut(0..n);
        // The pinned slice is larger than `n` only for zero-length buffers (handled above).
        self.inner
            .memcpy_htod(&src.raw, &mut view)
            .ctx("cuMemcpyHtoDAsync")?;
        self.mark(src)
    }

    /// Remember the point after a copy involving `p`, for its host views to wait on.
    fn mark<T>(&self, p: &PinnedBuffer<T>) -> Result<()> {
        let e = self.inner.record_event(None).ctx("cuEventRecord")?;
        *p.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        Ok(())
    }

    /// Device -> pinned host, asynchronous (see [`Self::copy_from_pinned`]).
    pub fn copy_to_pinned<T: Pod>(
        &self,
        src: &DeviceView<'_, T>,
        dst: &mut PinnedBuffer<T>,
    ) -> Result<()> {
        check_len("device -> pinned copy", dst.len(), src.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.inner
            .memcpy_dtoh(&src.raw, &mut dst.raw)
            .ctx("cuMemcpyDtoHAsync")?;
        self.mark(dst)
    }

    /// Start a launch of `kernel` on this stream; push its arguments in the
    /// order of the kernel's parameters, then [`Launch::run`].
    pub fn launch<'a>(&'a self, kernel: &'a Kernel) -> Launch<'a> {
        Launch {
            args: self.inner.launch_builder(&kernel.func),
            kernel,
        }
    }
}

/// Grid and block shape of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
}

/// A kernel launch being assembled: arguments are pushed in order. Buffers
/// are borrowed until the launch is queued, and cudarc's stream tracking keeps
/// them alive (stream-ordered frees) until the kernel is done.
pub struct Launch<'a> {
    args: LaunchArgs<'a>,
    kernel: &'a Kernel,
}

impl<'a> Launch<'a> {
    /// A buffer the kernel reads (`const T*`).
    pub fn buf<T>(mut self, b: &'a DeviceBuffer<T>) -> Self {
        self.args.arg(&b.raw);
        self
    }

    /// A buffer the kernel writes (`T*`).
    pub fn buf_mut<T>(mut self, b: &'a mut DeviceBuffer<T>) -> Self {
        self.args.arg(&mut b.raw);
        self
    }

    /// A range of a buffer the kernel reads.
    pub fn view<T>(mut self, v: &'a DeviceView<'a, T>) -> Self {
        self.args.arg(&v.raw);
        self
    }

    /// A device address ([`DevicePtr`]).
    pub fn ptr(mut self, p: &'a crate::DevicePtr) -> Self {
        self.args.arg(p.raw());
        self
    }

    /// A null pointer, for a kernel's optional buffer argument.
    pub fn null(mut self) -> Self {
        static NULL: u64 = 0;
        self.args.arg(&NULL);
        self
    }

    /// A mapped host buffer, passed as a device pointer the kernel reads or writes.
    pub fn mapped<T>(mut self, m: &'a MappedBuffer<T>) -> Self {
        self.args.arg(&m.device_ptr);
        self
    }

    /// A scalar (`int`, `float`, `unsigned long long`, ...).
    pub fn scalar<T: cudarc::driver::DeviceRepr>(mut self, v: &'a T) -> Self {
        self.args.arg(v);
        self
    }

    /// Queue the launch. The launch error, if any, is returned now; errors the
    /// kernel raises while running surface at the next synchronization.
    ///
    /// # Safety
    /// The pushed arguments must match the kernel's parameters in number, order
    /// and type, and `cfg` must keep the kernel inside the buffers it was given
    /// (each launcher in m40-kernels checks this for its kernel).
    pub unsafe fn run(mut self, cfg: LaunchConfig) -> Result<()> {
        let c = cudarc::driver::LaunchConfig {
            grid_dim: cfg.grid,
            block_dim: cfg.block,
            shared_mem_bytes: cfg.shared_bytes,
        };
        // SAFETY: forwarded to the caller (see # Safety).
        unsafe { self.args.launch(c) }
            .map(|_| ())
            .map_err(|source| DeviceError::Launch {
                kernel: self.kernel.name,
                source,
            })
    }
}
