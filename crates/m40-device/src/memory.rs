//! Typed device buffers (RAII, counted against the budget), views into them,
//! pinned host buffers and mapped (zero-copy) pinned buffers.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytemuck::Pod;
use cudarc::driver::{sys, CudaEvent, CudaSlice, CudaView, PinnedHostSlice};

use crate::device::{Budget, Device};
use crate::error::{Ctx, DeviceError, Result};

/// Bytes of slack after every device buffer: a kernel may read a 16-byte
/// vector that straddles the end of the data without leaving the allocation.
pub const TAIL_SLACK: usize = 16;

/// `len` elements of `T` in device memory. Freed (stream-ordered) on drop;
/// the bytes go back to the device's budget.
pub struct DeviceBuffer<T> {
    pub(crate) raw: CudaSlice<u8>,
    len: usize,
    budget: Arc<Budget>,
    reserved: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> DeviceBuffer<T> {
    pub(crate) fn from_raw(
        raw: CudaSlice<u8>,
        len: usize,
        device: &Device,
        reserved: usize,
    ) -> Self {
        Self {
            raw,
            len,
            budget: device.budget.clone(),
            reserved,
            _t: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Elements `range` of this buffer, for passing to a kernel or a copy.
    pub fn slice(&self, range: Range<usize>) -> Result<DeviceView<'_, T>> {
        let sz = std::mem::size_of::<T>();
        if range.start > range.end || range.end > self.len {
            return Err(DeviceError::Size {
                what: "device buffer slice",
                len: range.end,
                capacity: self.len,
            });
        }
        Ok(DeviceView {
            raw: self.raw.slice(range.start * sz..range.end * sz),
            len: range.len(),
            byte_offset: range.start * sz,
            _t: PhantomData,
        })
    }

    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView {
            raw: self.raw.slice(0..self.num_bytes()),
            len: self.len,
            byte_offset: 0,
            _t: PhantomData,
        }
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.reserved, Ordering::AcqRel);
    }
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{}]",
            std::any::type_name::<T>(),
            self.len
        )
    }
}

/// A read-only range of a [`DeviceBuffer`].
pub struct DeviceView<'a, T> {
    pub(crate) raw: CudaView<'a, u8>,
    len: usize,
    byte_offset: usize,
    _t: PhantomData<T>,
}

impl<T> DeviceView<'_, T> {
    /// Whether the view starts at a multiple of `align` bytes (allocations
    /// start at multiples of 256), for kernels that load 16-byte vectors.
    pub fn is_aligned(&self, align: usize) -> bool {
        self.byte_offset.is_multiple_of(align)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Page-locked host memory: copies from and to it run asynchronously.
pub struct PinnedBuffer<T> {
    pub(crate) raw: PinnedHostSlice<u8>,
    len: usize,
    /// Recorded after the last asynchronous copy from or to this buffer; the
    /// host views wait for it. (cudarc records its own only in multi-stream mode.)
    pub(crate) pending: Mutex<Option<CudaEvent>>,
    _t: PhantomData<T>,
}

impl<T: Pod> PinnedBuffer<T> {
    pub(crate) fn alloc(device: &Device, len: usize, flags: u32, what: &str) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(DeviceError::Size {
                what: "pinned buffer",
                len,
                capacity: usize::MAX / std::mem::size_of::<T>().max(1),
            })?;
        // SAFETY: the bytes are zeroed right below before anyone reads them.
        let mut raw = unsafe {
            device
                .ctx
                .alloc_pinned_with_flags::<u8>(bytes.max(1), flags)
        }
        .map_err(|e| match e.0 {
            sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                device.oom(&format!("{what} (pinned host memory)"), bytes)
            }
            _ => DeviceError::Driver {
                op: "cuMemHostAlloc",
                source: e,
            },
        })?;
        raw.as_mut_slice().ctx("pinned buffer")?.fill(0);
        Ok(Self {
            raw,
            len,
            pending: Mutex::new(None),
            _t: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Wait for the last asynchronous copy from or to this buffer.
    fn settle(&self) -> Result<()> {
        let event = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match event {
            Some(e) => e.synchronize().ctx("cuEventSynchronize"),
            None => Ok(()),
        }
    }

    /// The host view. Waits for copies into this buffer that are still running.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.settle()?;
        let bytes = self.raw.as_slice().ctx("pinned buffer")?;
        Ok(bytemuck::cast_slice(
            &bytes[..self.len * std::mem::size_of::<T>()],
        ))
    }

    /// The host view, mutable. Waits for copies from this buffer that are still running.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.settle()?;
        let n = self.len * std::mem::size_of::<T>();
        let bytes = self.raw.as_mut_slice().ctx("pinned buffer")?;
        Ok(bytemuck::cast_slice_mut(&mut bytes[..n]))
    }
}

/// Pinned host memory that kernels read and write directly over the bus (no
/// copy): the host side of command and result rings. Reads on the host see
/// what the GPU wrote once the kernel that wrote it has finished (or, for
/// persistent kernels, once a flag written after it is seen, with volatile reads).
pub struct MappedBuffer<T> {
    host: PinnedBuffer<T>,
    /// The device address of the same memory; pushed to kernels as a pointer.
    pub(crate) device_ptr: u64,
}

impl<T: Pod> MappedBuffer<T> {
    pub(crate) fn alloc(device: &Device, len: usize, what: &str) -> Result<Self> {
        let host = PinnedBuffer::<T>::alloc(
            device,
            len,
            sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            what,
        )?;
        let host_ptr = host.raw.as_ptr().ctx("mapped buffer")? as *mut std::ffi::c_void;
        let mut device_ptr = 0;
        device.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        // SAFETY: `host_ptr` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in this
        // context and lives as long as `host`, which owns it next to `device_ptr`.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host_ptr, 0) }
            .result()
            .ctx("cuMemHostGetDevicePointer")?;
        Ok(Self { host, device_ptr })
    }

    pub fn len(&self) -> usize {
        self.host.len()
    }

    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }

    /// What the host sees. Synchronize the stream whose kernels wrote here first.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.host.as_slice()
    }

    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.host.as_mut_slice()
    }
}
