//! Any byte string either opens as a GGUF file or gives a typed error; an
//! opened file's hyperparameter check and dequantization never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use m40_gguf::{GgufFile, HyperParams};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let _ = HyperParams::from_file(&f);
    for (k, _) in f.metadata().iter() {
        let _ = f.metadata().opt_str(k);
        let _ = f.metadata().opt_u64(k);
    }
    for info in f.tensors() {
        if info.ty.is_supported() && info.n_elements() <= 1 << 20 {
            let v = f.view(info).to_f32().expect("a parsed tensor of a supported type dequantizes");
            assert_eq!(v.len() as u64, info.n_elements());
        }
    }
});
