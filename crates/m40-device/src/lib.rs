//! The device layer: the only crate of m40-llm that calls CUDA.
//!
//! Built on cudarc's driver API with dynamic loading: nothing here needs CUDA
//! to build, and `libcuda` is opened only when a [`Device`] is first asked
//! for, so machines without a GPU get [`DeviceError::NoDriver`] /
//! [`DeviceError::NoDevice`] instead of a crash.
//!
//! - [`Device`]: an open GPU with its [`DeviceInfo`] and a memory budget
//!   (allocations beyond a share of the free memory are refused with an error
//!   naming what was being allocated).
//! - [`Stream`]: allocation, copies (pageable, pinned, device to device),
//!   [`Event`]s, and kernel launches ([`Launch`]).
//! - [`DeviceBuffer`] / [`DeviceView`]: typed device memory with RAII; raw
//!   device pointers never leave this crate.
//! - [`PinnedBuffer`], [`MappedBuffer`]: page-locked host memory, the latter
//!   addressed by kernels directly.
//! - [`Module`] / [`Kernel`]: PTX loaded into a device.

mod args;
mod device;
mod error;
mod memory;
mod module;
mod stream;
pub mod testing;

pub use args::{ArgBlock, DevicePtr, KernelArgs};
pub use device::{Device, DeviceInfo, DeviceOptions};
pub use error::{DeviceError, Result, MIN_DRIVER_VERSION};
pub use memory::{DeviceBuffer, DeviceView, MappedBuffer, PinnedBuffer, TAIL_SLACK};
pub use module::{Kernel, KernelAttributes, Module};
pub use stream::{Event, Graph, Launch, LaunchConfig, Stream};
