//! Kernel arguments in device memory: for a kernel that runs a program of
//! ops whose arguments it reads from a buffer (m40-kernels' persistent
//! decode kernel), each op's arguments are written with C struct layout by
//! [`ArgBlock`], through the same calls ([`KernelArgs`]) that push a
//! [`Launch`]'s parameters, so one function serves both.

use bytemuck::Pod;
use cudarc::driver::{DevicePtr as _, DeviceRepr};

use crate::memory::{DeviceBuffer, DeviceView};
use crate::stream::{Launch, Stream};

/// The device address of (a range of) a buffer, opaque: it can only be
/// passed to a kernel ([`Launch::ptr`], [`ArgBlock::ptr`]), where it is
/// valid as long as the buffer it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePtr(u64);

impl DevicePtr {
    pub(crate) fn raw(&self) -> &u64 {
        &self.0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}

impl<T> DeviceBuffer<T> {
    /// This buffer's device address.
    pub fn device_ptr(&self, stream: &Stream) -> DevicePtr {
        let (p, _sync) = self.raw.device_ptr(&stream.inner);
        DevicePtr(p)
    }
}

impl<T> DeviceView<'_, T> {
    /// This view's device address.
    pub fn device_ptr(&self, stream: &Stream) -> DevicePtr {
        let (p, _sync) = self.raw.device_ptr(&stream.inner);
        DevicePtr(p)
    }
}

/// Pushing a kernel's arguments in the order of its parameters: into a
/// launch, or into an [`ArgBlock`].
pub trait KernelArgs<'a>: Sized {
    /// A buffer the kernel reads (`const T*`).
    fn buf<T>(self, b: &'a DeviceBuffer<T>) -> Self;
    /// A buffer the kernel writes (`T*`).
    fn buf_mut<T>(self, b: &'a mut DeviceBuffer<T>) -> Self;
    /// A range of a buffer the kernel reads.
    fn view<T>(self, v: &'a DeviceView<'a, T>) -> Self;
    /// A null pointer.
    fn null(self) -> Self;
    /// A scalar (`int`, `float`, ...).
    fn scalar<T: DeviceRepr + Pod>(self, v: &'a T) -> Self;
}

impl<'a> KernelArgs<'a> for Launch<'a> {
    fn buf<T>(self, b: &'a DeviceBuffer<T>) -> Self {
        Launch::buf(self, b)
    }
    fn buf_mut<T>(self, b: &'a mut DeviceBuffer<T>) -> Self {
        Launch::buf_mut(self, b)
    }
    fn view<T>(self, v: &'a DeviceView<'a, T>) -> Self {
        Launch::view(self, v)
    }
    fn null(self) -> Self {
        Launch::null(self)
    }
    fn scalar<T: DeviceRepr + Pod>(self, v: &'a T) -> Self {
        Launch::scalar(self, v)
    }
}

/// Append field `v` (a scalar's or pointer's bytes) at the next multiple of
/// its size.
fn place(bytes: &mut Vec<u8>, v: &[u8]) {
    let at = bytes.len().next_multiple_of(v.len().max(1));
    bytes.resize(at, 0);
    bytes.extend_from_slice(v);
}

/// Arguments laid out as the fields of a C struct with the parameters'
/// types in their order: each at the next multiple of its size (pointers 8
/// bytes), the whole padded to a multiple of 8.
pub struct ArgBlock<'s> {
    stream: &'s Stream,
    bytes: Vec<u8>,
}

impl<'s> ArgBlock<'s> {
    /// An empty block; `stream` is the one the program will run on.
    pub fn new(stream: &'s Stream) -> Self {
        Self {
            stream,
            bytes: Vec::new(),
        }
    }

    fn push(mut self, v: &[u8]) -> Self {
        place(&mut self.bytes, v);
        self
    }

    /// A device address (a `T*` field).
    pub fn ptr(self, p: DevicePtr) -> Self {
        self.push(&p.0.to_ne_bytes())
    }

    /// The bytes, padded to a multiple of 8.
    pub fn into_bytes(mut self) -> Vec<u8> {
        let n = self.bytes.len().next_multiple_of(8);
        self.bytes.resize(n, 0);
        self.bytes
    }
}

impl<'a> KernelArgs<'a> for ArgBlock<'_> {
    fn buf<T>(self, b: &'a DeviceBuffer<T>) -> Self {
        let p = b.device_ptr(self.stream);
        self.ptr(p)
    }
    fn buf_mut<T>(self, b: &'a mut DeviceBuffer<T>) -> Self {
        let p = b.device_ptr(self.stream);
        self.ptr(p)
    }
    fn view<T>(self, v: &'a DeviceView<'a, T>) -> Self {
        let p = v.device_ptr(self.stream);
        self.ptr(p)
    }
    fn null(self) -> Self {
        self.ptr(DevicePtr(0))
    }
    fn scalar<T: DeviceRepr + Pod>(self, v: &'a T) -> Self {
        self.push(bytemuck::bytes_of(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// C's layout for a struct of `int, T*, int, float, T*, int`.
    #[test]
    fn fields_land_where_c_puts_them() {
        let mut b = Vec::new();
        place(&mut b, &1i32.to_ne_bytes());
        place(&mut b, &7u64.to_ne_bytes());
        place(&mut b, &2i32.to_ne_bytes());
        place(&mut b, &0.5f32.to_ne_bytes());
        place(&mut b, &9u64.to_ne_bytes());
        place(&mut b, &3i32.to_ne_bytes());
        assert_eq!(b.len(), 36);
        assert_eq!(&b[0..4], &1i32.to_ne_bytes());
        assert_eq!(&b[4..8], &[0; 4]);
        assert_eq!(&b[8..16], &7u64.to_ne_bytes());
        assert_eq!(&b[16..20], &2i32.to_ne_bytes());
        assert_eq!(&b[20..24], &0.5f32.to_ne_bytes());
        assert_eq!(&b[24..32], &9u64.to_ne_bytes());
        assert_eq!(&b[32..36], &3i32.to_ne_bytes());
    }
}
