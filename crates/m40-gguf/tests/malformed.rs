//! Malformed files give a typed error: never a panic, a hang, or an
//! allocation beyond the file.

use m40_gguf::{GgufError, GgufFile};

/// A hand-built GGUF image whose every field the tests can corrupt.
struct Image {
    version: u32,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64)>,
    data_len: usize,
}

fn string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Image {
    fn valid() -> Self {
        let mut arr = 4u32.to_le_bytes().to_vec(); // array of u32
        arr.extend_from_slice(&3u64.to_le_bytes());
        for x in [1u32, 2, 3] {
            arr.extend_from_slice(&x.to_le_bytes());
        }
        Image {
            version: 3,
            tensor_count: None,
            kv_count: None,
            kvs: vec![
                ("general.architecture".into(), 8, string("llama")),
                ("test.list".into(), 9, arr),
                ("test.flag".into(), 7, vec![1]),
            ],
            tensors: vec![
                ("a.weight".into(), vec![32, 2], 8, 0),
                ("b.weight".into(), vec![4], 0, 96),
            ],
            data_len: 112,
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = 0x4655_4747u32.to_le_bytes().to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(
            &self
                .tensor_count
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        b.extend_from_slice(&self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kvs {
            b.extend(string(k));
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(v);
        }
        for (name, dims, ty, off) in &self.tensors {
            b.extend(string(name));
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&off.to_le_bytes());
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend((0..self.data_len).map(|i| (i % 7) as u8));
        b
    }
}

fn open(img: &Image) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(img.bytes())
}

fn err(img: &Image) -> String {
    match open(img) {
        Ok(_) => panic!("malformed image was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_valid_image_opens() {
    let f = open(&Image::valid()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.metadata().str("general.architecture").unwrap(), "llama");
    assert_eq!(f.tensor("a.weight").unwrap().data.len(), 68);
    assert_eq!(f.tensor("b.weight").unwrap().to_f32().unwrap().len(), 4);
}

#[test]
fn keys_llama_cpp_writes_open_whatever_their_spelling() {
    // gguf-rs-lib's reader refused every key that is not dot-separated
    // lower_snake_case; llama.cpp writes architectures with '-' in their keys
    // and reads any UTF-8 key.
    let mut img = Image::valid();
    img.kvs[0].2 = string("command-r");
    img.kvs.push((
        "command-r.attention.layer_norm_epsilon".into(),
        6,
        1e-5f32.to_le_bytes().to_vec(),
    ));
    img.kvs.push((
        "gpt-oss.expert_count".into(),
        4,
        32u32.to_le_bytes().to_vec(),
    ));
    img.kvs.push(("Some.Vendor Key".into(), 8, string("kept")));
    let f = open(&img).unwrap();
    let m = f.metadata();
    assert_eq!(m.str("general.architecture").unwrap(), "command-r");
    assert_eq!(
        m.opt_f64("command-r.attention.layer_norm_epsilon").unwrap(),
        Some(1e-5f32.into())
    );
    assert_eq!(m.u64("gpt-oss.expert_count").unwrap(), 32);
    assert_eq!(m.str("Some.Vendor Key").unwrap(), "kept");
    assert_eq!(f.tensors().len(), 2);
}

#[test]
fn alignment_is_read_and_checked() {
    // general.alignment 64: b.weight's offset 96 is off it, 128 is on it.
    let mut img = Image::valid();
    img.kvs
        .push(("general.alignment".into(), 4, 64u32.to_le_bytes().to_vec()));
    let e = err(&img);
    assert!(e.contains("b.weight") && e.contains("alignment 64"), "{e}");
    img.tensors[1].3 = 128;
    // The image pads its header to 32 bytes; the data starts at the next
    // multiple of 64, up to 32 bytes later: room for b.weight either way.
    img.data_len = 128 + 16 + 32;
    let f = open(&img).unwrap();
    assert_eq!(f.alignment(), 64);
    assert!(f.data_offset().is_multiple_of(64));
    assert_eq!(f.tensor("b.weight").unwrap().to_f32().unwrap().len(), 4);
    // Not a power of two, or not a u32: refused, as llama.cpp does.
    for (ty, v) in [
        (4u32, 48u32.to_le_bytes().to_vec()),
        (10, 64u64.to_le_bytes().to_vec()),
    ] {
        let mut img = Image::valid();
        img.kvs.push(("general.alignment".into(), ty, v));
        assert!(err(&img).contains("general.alignment"));
    }
}

#[test]
fn version_2_opens_and_other_versions_do_not() {
    let mut img = Image::valid();
    img.version = 2;
    assert_eq!(open(&img).unwrap().version(), 2);
    for v in [0, 1, 4, 0xFFFF_FFFF] {
        img.version = v;
        assert!(matches!(open(&img), Err(GgufError::UnsupportedVersion(x)) if x == v));
    }
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let bytes = Image::valid().bytes();
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(
            r.is_err(),
            "truncated to {len} of {} bytes was accepted",
            bytes.len()
        );
    }
    assert!(GgufFile::from_bytes(bytes).is_ok());
}

#[test]
fn a_file_cut_in_its_tensor_data_says_how_much_is_missing() {
    let bytes = Image::valid().bytes();
    for missing in [1usize, 5, 16] {
        let e = GgufFile::from_bytes(bytes[..bytes.len() - missing].to_vec()).unwrap_err();
        assert!(
            matches!(e, GgufError::Incomplete { file_size, needed }
                if needed == bytes.len() as u64 && file_size == (bytes.len() - missing) as u64),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("({missing} missing)")) && msg.contains("cut short"),
            "{msg}"
        );
    }
}

#[test]
fn wrong_magic() {
    let mut b = Image::valid().bytes();
    b[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(
        GgufFile::from_bytes(b"GGML\x03\0\0\0".to_vec()),
        Err(GgufError::BadMagic { .. })
    ));
}

#[test]
fn absurd_counts() {
    for n in [1u64 << 60, u64::MAX, 1_000_000] {
        let mut img = Image::valid();
        img.tensor_count = Some(n);
        assert!(err(&img).contains("tensor count"), "{}", err(&img));
        let mut img = Image::valid();
        img.kv_count = Some(n);
        assert!(err(&img).contains("metadata count"), "{}", err(&img));
    }
}

#[test]
fn string_and_array_lengths_past_the_end() {
    let mut img = Image::valid();
    let mut v = (1u64 << 60).to_le_bytes().to_vec();
    v.extend_from_slice(b"llama");
    img.kvs[0].2 = v;
    let e = err(&img);
    assert!(
        e.contains("general.architecture") && e.contains("past the end"),
        "{e}"
    );

    let mut img = Image::valid();
    let mut arr = 4u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&(1u64 << 40).to_le_bytes());
    img.kvs[1].2 = arr;
    let e = err(&img);
    assert!(e.contains("test.list") && e.contains("elements"), "{e}");

    let mut img = Image::valid();
    let mut arr = 8u32.to_le_bytes().to_vec(); // array of strings, claimed huge
    arr.extend_from_slice(&u64::MAX.to_le_bytes());
    img.kvs[1].2 = arr;
    assert!(err(&img).contains("test.list"));
}

#[test]
fn unknown_value_types_and_bad_bools() {
    let mut img = Image::valid();
    img.kvs[2].1 = 13;
    assert!(err(&img).contains("unknown value type 13"));
    let mut img = Image::valid();
    img.kvs[2].2 = vec![7];
    assert!(err(&img).contains("test.flag"));
    let mut img = Image::valid();
    let mut deep = Vec::new();
    for _ in 0..100 {
        deep.extend_from_slice(&9u32.to_le_bytes());
        deep.extend_from_slice(&1u64.to_le_bytes());
    }
    img.kvs[1].2 = deep;
    assert!(err(&img).contains("nest"));
}

#[test]
fn tensor_data_past_the_end_or_misaligned() {
    let mut img = Image::valid();
    img.tensors[1].3 = 4096;
    assert!(err(&img).contains("b.weight"));
    let mut img = Image::valid();
    img.tensors[1].3 = u64::MAX - 3;
    assert!(err(&img).contains("b.weight"));
    let mut img = Image::valid();
    img.tensors[1].3 = 72; // inside the file, but not on a 32-byte boundary
    let e = err(&img);
    assert!(e.contains("b.weight") && e.contains("align"), "{e}");
}

#[test]
fn duplicates() {
    let mut img = Image::valid();
    img.tensors[1].0 = "a.weight".into();
    assert!(matches!(
        open(&img),
        Err(GgufError::Duplicate { kind: "tensor", .. })
    ));
    let mut img = Image::valid();
    img.kvs[1].0 = "general.architecture".into();
    assert!(matches!(
        open(&img),
        Err(GgufError::Duplicate {
            kind: "metadata key",
            ..
        })
    ));
}

#[test]
fn unknown_type_ids() {
    for id in [4u32, 5, 31, 99, u32::MAX] {
        let mut img = Image::valid();
        img.tensors[1].2 = id;
        assert!(matches!(open(&img), Err(GgufError::UnknownType { id: x, .. }) if x == id));
    }
}

#[test]
fn zero_overflowing_and_bad_dimensions() {
    let mut img = Image::valid();
    img.tensors[0].1 = vec![32, 0];
    assert!(err(&img).contains("zero dimension"));
    let mut img = Image::valid();
    img.tensors[0].1 = vec![1 << 32, 1 << 32, 1 << 32];
    assert!(err(&img).contains("overflow"));
    let mut img = Image::valid();
    img.tensors[0].1 = vec![31, 2]; // Q8_0 rows must be whole blocks
    assert!(err(&img).contains("block size"));
    let mut img = Image::valid();
    img.tensors[0].1 = vec![];
    assert!(err(&img).contains("dimensions"));
    let mut img = Image::valid();
    img.tensors[0].1 = vec![1; 5];
    assert!(err(&img).contains("dimensions"));
}

#[test]
fn garbage_never_panics() {
    // A cheap in-test fuzz: flip bytes of the valid image, every result must
    // be Ok or a typed error (the cargo-fuzz target goes further).
    // An accepted file must be whole: every tensor it lists opens with
    // exactly its byte count, every metadata value reads.
    let base = Image::valid().bytes();
    let mut state = 0x1234_5678_9abc_def0u64;
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state as usize) % b.len();
            b[i] = (state >> 32) as u8;
        }
        let len = b.len() as u64;
        match GgufFile::from_bytes(b) {
            Ok(f) => {
                accepted += 1;
                for t in f.tensors() {
                    let v = f.tensor(&t.name).expect("a listed tensor opens");
                    assert_eq!(v.data.len() as u64, t.n_bytes, "{}", t.name);
                    assert!(t.n_bytes <= len);
                }
                for (key, value) in f.metadata().iter() {
                    assert!(!key.is_empty());
                    let _ = format!("{value:?}");
                }
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    // Both outcomes happen: the corruptions reach the checks and the
    // bytes no check reads.
    assert!(
        accepted > 100 && refused > 100,
        "{accepted} accepted, {refused} refused"
    );
}
