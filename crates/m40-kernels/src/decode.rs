//! The persistent decode kernel (kernels/decode.cu): a decode step's
//! one-token packed GEMVs, attention and split combines recorded as a
//! program of ops and run by one launch, ordered by grid barriers instead
//! of kernel boundaries.
//!
//! While [`Kernels::record_decode`] runs its closure, the launchers that
//! have an op in the program ([`Kernels::gemv_packed_to`] for one token,
//! [`Kernels::attention`] for shapes the program's blocks hold) append their
//! arguments to it instead of launching; any other launch first launches
//! the ops recorded before it, so the order of the work is the order of the
//! calls. This module is the seam: a launcher asks [`Kernels::exec`] where
//! its op goes and hands its arguments to [`Kernels::submit`], the same
//! code for a launch and a record; only here is it known which. Made for a captured decode step: the graph keeps the launches,
//! and [`DecodeProgram::upload`] puts the recorded arguments in device
//! memory once, before the graph first runs.

use m40_device::{ArgBlock, DeviceBuffer, DevicePtr, Kernel, KernelArgs, LaunchConfig, Stream};

use crate::error::{KernelError, Result};
use crate::launch::cfg;
use crate::Kernels;

/// Bytes per op of the program (`DEC_OP_BYTES`): a [`DecodeOpHead`] of
/// `HEAD_BYTES`, then the op's arguments.
pub(crate) const DEC_OP_BYTES: usize = 256;
const HEAD_BYTES: usize = 32;
/// Threads per block (`DEC_THREADS`).
pub(crate) const DEC_THREADS: u32 = 128;
/// Dynamic shared memory per block: attention's for head dimensions up to
/// 128 (the program's attention ops, `attn_block<1..4>`; attention.rs
/// checks the figure); the split combine's (at most 1024 splits and the
/// block's threads) fits in it.
pub(crate) const DEC_MAX_HEAD_DIM: usize = 128;
pub(crate) const DEC_SHARED: usize = 20608;
const _: () = assert!(DEC_SHARED >= 4 * (1024 + DEC_THREADS as usize));
/// Barrier counters (`DEC_SYNC_WORDS`).
const DEC_SYNC_WORDS: usize = 3 * 32;
/// kernels/gemv_packed.cuh `FOLD_*`.
pub(crate) const FOLD_NONE: i32 = 0;
pub(crate) const FOLD_TAKE: i32 = 1;
pub(crate) const FOLD_EMIT: i32 = 2;

/// `DEC_OP_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecodeOp {
    Gemv = 1,
    Attn = 2,
    Combine = 3,
}

/// kernels/decode.cu `DecOpHead`.
pub(crate) struct DecodeOpHead {
    pub kind: DecodeOp,
    /// Blocks a launch of the op's own kernel would have.
    pub blocks: usize,
    /// GEMV: the packed format's number; attention: R (head dims <= 32 R).
    pub variant: i32,
    /// GEMV: FOLD_*.
    pub fold: i32,
    /// Attention: its grid (token blocks, head blocks, splits).
    pub grid: [u32; 3],
}

/// Where a launcher's op goes ([`Kernels::exec`]).
pub(crate) enum Exec {
    /// Launched as its own kernel.
    Launch(Kernel),
    /// Recorded into the decode program, whose kernel runs on `resident`
    /// blocks (what the op is planned for).
    Record { resident: usize },
}

/// A launcher's arguments, pushed in the order of its kernel's parameters
/// into a launch or into a program's op (the kernel's parameter struct in
/// memory, which decode.cu reads).
pub(crate) trait OpArgs {
    fn push<'l, A: KernelArgs<'l>>(&'l mut self, a: A) -> A;
}

/// Device memory for a recorded decode program: its ops and the barrier
/// counters of the kernel that runs them.
pub struct DecodeProgram {
    ops: DeviceBuffer<u8>,
    sync: DeviceBuffer<u32>,
    recorded: Vec<u8>,
}

impl DecodeProgram {
    /// Room for `max_ops` ops.
    pub fn new(stream: &Stream, max_ops: usize) -> Result<Self> {
        Ok(Self {
            ops: stream.alloc::<u8>(max_ops.max(1) * DEC_OP_BYTES, "decode program")?,
            sync: stream.alloc_zeroed::<u32>(DEC_SYNC_WORDS, "decode program counters")?,
            recorded: Vec::new(),
        })
    }

    /// Copy the recorded ops to the device (stream-ordered: before any
    /// later launch on `stream` that runs them).
    pub fn upload(&mut self, stream: &Stream) -> Result<()> {
        if self.recorded.is_empty() {
            return Ok(());
        }
        let mut b = self.recorded.clone();
        b.resize(self.ops.len(), 0);
        stream.copy_to_device(&b, &mut self.ops)?;
        Ok(())
    }
}

/// The state of a recording.
pub(crate) struct Recorder {
    stream: Stream,
    ops: DevicePtr,
    sync: DevicePtr,
    capacity: usize,
    bytes: Vec<u8>,
    /// Ops already in a launch.
    launched: usize,
}

impl Kernels {
    /// Run `f` with the decode ops it queues on `stream` recorded into
    /// `prog` (see the module's documentation). Meant for inside
    /// [`Stream::capture`]: the launches read `prog`'s device memory when
    /// they run, so call [`DecodeProgram::upload`] after `f` and before
    /// they do; `prog` must outlive them.
    pub fn record_decode<T, E: From<KernelError>>(
        &self,
        stream: &Stream,
        prog: &mut DecodeProgram,
        f: impl FnOnce() -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let rec = Recorder {
            stream: stream.clone(),
            ops: prog.ops.device_ptr(stream),
            sync: prog.sync.device_ptr(stream),
            capacity: prog.ops.len() / DEC_OP_BYTES,
            bytes: Vec::new(),
            launched: 0,
        };
        let previous = self.recorder().replace(rec);
        assert!(previous.is_none(), "decode programs do not nest");
        let r = f();
        let mut rec = self.recorder().take().expect("recording");
        let flushed = match &r {
            Ok(_) => self.flush(&mut rec),
            Err(_) => Ok(()),
        };
        prog.recorded = rec.bytes;
        let t = r?;
        flushed?;
        Ok(t)
    }

    fn recorder(&self) -> std::sync::MutexGuard<'_, Option<Recorder>> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a decode program is recording.
    fn recording(&self) -> bool {
        self.recorder().is_some()
    }

    /// Where an op goes: into the decode program while one records and the
    /// op is `recordable` (the persistent kernel has it for these shapes),
    /// else launched as the kernel `kernel` gives.
    pub(crate) fn exec(
        &self,
        recordable: bool,
        kernel: impl FnOnce() -> Result<Kernel>,
    ) -> Result<Exec> {
        if recordable && self.recording() {
            let resident = self.decode_resident()?;
            return Ok(Exec::Record { resident });
        }
        Ok(Exec::Launch(kernel()?))
    }

    /// Launch `exec`'s kernel with `args` on `cfg`, or append the op `head`
    /// with the same arguments to the program.
    ///
    /// # Safety
    /// As launching the kernel: `args` are what it reads and writes, and
    /// the launcher has checked them (and `cfg`) against what it assumes.
    /// A recorded op's virtual blocks do what the kernel's blocks would.
    pub(crate) unsafe fn submit(
        &self,
        stream: &Stream,
        exec: &Exec,
        cfg: LaunchConfig,
        head: DecodeOpHead,
        args: &mut impl OpArgs,
    ) -> Result<()> {
        match exec {
            // SAFETY: the caller's (see the doc).
            Exec::Launch(kernel) => unsafe { args.push(stream.launch(kernel)).run(cfg)? },
            Exec::Record { .. } => {
                self.record_op(head, args.push(ArgBlock::new(stream)).into_bytes())?
            }
        }
        Ok(())
    }

    /// Blocks of the persistent kernel the GPU holds at once (its grid).
    fn decode_resident(&self) -> Result<usize> {
        let k = self.handle("decode", "decode_program")?;
        self.resident_blocks(&k, DEC_THREADS, DEC_SHARED as u32)
    }

    /// Append an op (its head and `args`, the C layout of its struct).
    fn record_op(&self, head: DecodeOpHead, args: Vec<u8>) -> Result<()> {
        let mut guard = self.recorder();
        let rec = guard.as_mut().expect("record_op while recording");
        const K: &str = "decode_program";
        if args.len() > DEC_OP_BYTES - HEAD_BYTES {
            return Err(KernelError::Shape {
                kernel: K,
                what: format!("{} bytes of op arguments", args.len()),
            });
        }
        if rec.bytes.len() / DEC_OP_BYTES >= rec.capacity {
            return Err(KernelError::Shape {
                kernel: K,
                what: format!("more than the program's {} ops", rec.capacity),
            });
        }
        let blocks = i32::try_from(head.blocks).map_err(|_| KernelError::Shape {
            kernel: K,
            what: format!("{} blocks", head.blocks),
        })?;
        let ints = [
            head.kind as i32,
            blocks,
            head.variant,
            head.fold,
            head.grid[0] as i32,
            head.grid[1] as i32,
            head.grid[2] as i32,
            0,
        ];
        let at = rec.bytes.len();
        for v in ints {
            rec.bytes.extend_from_slice(&v.to_ne_bytes());
        }
        rec.bytes.extend_from_slice(&args);
        rec.bytes.resize(at + DEC_OP_BYTES, 0);
        Ok(())
    }

    /// Launch the recorded ops not launched yet, if recording (every
    /// launcher's kernel lookup calls this first: see [`Kernels::kernel`]).
    pub(crate) fn flush_recorded(&self) -> Result<()> {
        let mut guard = self.recorder();
        match guard.as_mut() {
            Some(rec) => self.flush(rec),
            None => Ok(()),
        }
    }

    fn flush(&self, rec: &mut Recorder) -> Result<()> {
        let n = rec.bytes.len() / DEC_OP_BYTES - rec.launched;
        if n == 0 {
            return Ok(());
        }
        let kernel = self.handle("decode", "decode_program")?;
        let blocks = self.decode_resident()? as u32;
        let ops = rec.ops.offset(rec.launched * DEC_OP_BYTES);
        let n_ops = n as i32;
        // SAFETY: decode_program(const u8* ops, int n_ops, unsigned* sync):
        // reads n_ops ops from `ops` (within the program buffer: capacity
        // checked by record_op; the caller uploads them before the launch
        // runs) and the DEC_SYNC_WORDS counters of `sync` (zero before and
        // after); each
        // op's arguments were checked by its launcher as for its own kernel,
        // and its virtual blocks do what that kernel's blocks would. The grid
        // is the blocks the GPU holds at once (its barriers need every block
        // resident), DEC_SHARED bytes of dynamic shared memory each.
        unsafe {
            rec.stream
                .launch(&kernel)
                .ptr(&ops)
                .scalar(&n_ops)
                .ptr(&rec.sync)
                .run(m40_device::LaunchConfig {
                    shared_bytes: DEC_SHARED as u32,
                    ..cfg((blocks, 1, 1), DEC_THREADS)
                })?
        };
        rec.launched += n;
        Ok(())
    }
}
