# Run on the device machine from the repository root: python3 kernels/check/rmsnorm_check.py
# (needs CuPy and a GPU). Replaced by the Rust GPU test pack of issue 5.
# Stopgap GPU check of the committed PTX (until issue 5's Rust test pack):
# load kernels/ptx/rmsnorm.ptx (the driver JIT-compiles compute_52 PTX),
# fresh random inputs, poisoned output, every element vs a float64 reference.
import numpy as np, cupy as cp, sys
mod = cp.RawModule(path="kernels/ptx/rmsnorm.ptx")
f = mod.get_function("rmsnorm_f32")
rng = np.random.default_rng()
fails = 0; cases = 0
for n_rows, n in [(1, 1), (3, 31), (7, 576), (5, 1000), (2, 4096), (64, 14336), (1, 65537)]:
    x = rng.standard_normal((n_rows, n)).astype(np.float32) * rng.uniform(0.01, 10)
    w = rng.standard_normal(n).astype(np.float32)
    eps = np.float32(1e-5)
    dx, dw = cp.asarray(x), cp.asarray(w)
    dy = cp.full((n_rows, n), np.nan, dtype=np.float32)  # poison
    f((n_rows,), (256,), (dx, dw, dy, np.int32(n), eps))
    cp.cuda.runtime.deviceSynchronize()
    y = cp.asnumpy(dy)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-5) * w.astype(np.float64)
    err = np.abs(y - ref); tol = 1e-5 * np.abs(ref) + 1e-6
    bad = int((~(err <= tol)).sum())  # NaN (unwritten) counts as bad
    cases += 1
    print(f"rmsnorm rows={n_rows} n={n}: max abs err {np.nanmax(err):.2e}, bad {bad}/{y.size}")
    fails += bad > 0
print(f"{cases - fails} passed, {fails} failed")
print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "driver", cp.cuda.runtime.driverGetVersion())
sys.exit(1 if fails else 0)
