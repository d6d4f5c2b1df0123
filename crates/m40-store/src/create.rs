//! Customised models: `create` (a Modelfile over a stored model or a GGUF
//! path) and `copy`. A created model is a manifest that points at the same
//! file as the model it comes from (no copy of the weights) and keeps its
//! Modelfile, merged onto the base's, for the server to apply.

use std::path::Path;

use crate::{canonical, sha256_file, Manifest, Modelfile, Result, Store, StoreError};

impl Store {
    /// Store `name` as `modelfile` says: its `FROM` a stored model (whose
    /// own instructions it builds on) or a GGUF file on this machine.
    pub fn create(&self, name: &str, modelfile: &Modelfile) -> Result<Manifest> {
        modelfile
            .check_values()
            .map_err(|e| StoreError::BadRef(name.to_string(), e))?;
        self.manifest_path(name)?;
        let from = modelfile.from.trim();
        let base = match self.manifest(from)? {
            Some(m) => m,
            None if Path::new(from).is_file() => {
                let path = Path::new(from)
                    .canonicalize()
                    .map_err(crate::io(Path::new(from)))?;
                crate::check_gguf_magic(&path, from)?;
                Manifest {
                    name: from.to_string(),
                    sha256: sha256_file(&path)?,
                    size: std::fs::metadata(&path).map_err(crate::io(&path))?.len(),
                    source: path.display().to_string(),
                    path,
                    modelfile: None,
                }
            }
            None => return Err(StoreError::NotStored(from.to_string())),
        };
        let merged = match &base.modelfile {
            Some(b) => modelfile.over(b),
            None => modelfile.clone(),
        };
        let m = Manifest {
            name: canonical(name).to_string(),
            path: base.path,
            sha256: base.sha256,
            size: base.size,
            source: format!("created from {from}"),
            modelfile: Some(merged),
        };
        self.write_manifest(&m)?;
        Ok(m)
    }

    /// Store `destination` as a copy of `source` (the same file and
    /// instructions).
    pub fn copy(&self, source: &str, destination: &str) -> Result<Manifest> {
        let m = self
            .manifest(source)?
            .ok_or_else(|| StoreError::NotStored(source.to_string()))?;
        let copy = Manifest {
            name: canonical(destination).to_string(),
            ..m
        };
        self.write_manifest(&copy)?;
        Ok(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modelfile(text: &str) -> Modelfile {
        Modelfile::parse(text).unwrap()
    }

    #[test]
    fn created_models_share_the_file_and_layer_their_instructions() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::new(dir.path().join("store"));
        // A fetched file, as a pull leaves it.
        let blob = dir.path().join("store/blobs/sha256-ab");
        std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
        std::fs::write(&blob, b"GGUF\x03\0\0\0 weights").unwrap();
        let base = Manifest {
            name: "smollm2:135m".into(),
            path: blob.clone(),
            sha256: "ab".into(),
            size: 18,
            source: "test".into(),
            modelfile: None,
        };
        s.write_manifest(&base).unwrap();
        let mario = s
            .create(
                "mario",
                &modelfile("FROM smollm2\nSYSTEM You are Mario.\nPARAMETER temperature 0.3"),
            )
            .unwrap();
        assert_eq!(mario.name, "mario");
        assert_eq!(
            (&mario.path, &mario.sha256, mario.size),
            (&blob, &base.sha256, 18)
        );
        assert_eq!(s.manifest("mario:latest").unwrap(), Some(mario.clone()));
        // One over it keeps what it does not replace.
        let luigi = s
            .create("luigi:brief", &modelfile("FROM mario\nPARAMETER top_k 5"))
            .unwrap();
        let mf = luigi.modelfile.as_ref().unwrap();
        assert_eq!(mf.system.as_deref(), Some("You are Mario."));
        assert_eq!(mf.parameter("temperature"), Some("0.3"));
        assert_eq!(mf.parameter("top_k"), Some("5"));
        assert_eq!(mf.from, "mario");
        let copy = s.copy("luigi:brief", "luigi2").unwrap();
        assert_eq!(copy.modelfile, luigi.modelfile);
        assert_eq!(s.manifest("luigi2").unwrap(), Some(copy));
        // The file stays while any name points at it.
        s.remove("smollm2:135m").unwrap();
        s.remove("mario").unwrap();
        s.remove("luigi:brief").unwrap();
        assert!(blob.is_file());
        s.remove("luigi2").unwrap();
        assert!(!blob.exists());
    }

    #[test]
    fn a_path_is_used_in_place_and_mistakes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::new(dir.path().join("store"));
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"GGUF\x03\0\0\0").unwrap();
        let text = format!("FROM {}\nMESSAGE user hi", file.display());
        let m = s.create("mine", &modelfile(&text)).unwrap();
        assert_eq!(m.path, file.canonicalize().unwrap());
        assert_eq!(m.sha256, sha256_file(&file).unwrap());
        assert_eq!(
            m.modelfile.unwrap().messages,
            [("user".into(), "hi".into())]
        );
        let e = s.create("x", &modelfile("FROM nothing:here")).unwrap_err();
        assert!(matches!(e, StoreError::NotStored(_)), "{e}");
        let e = s
            .create(
                "x",
                &modelfile(&format!("FROM {}\nPARAMETER seed lots", file.display())),
            )
            .unwrap_err();
        assert!(e.to_string().contains("seed lots"), "{e}");
        let e = s.create("../x", &modelfile(&text)).unwrap_err();
        assert!(matches!(e, StoreError::BadRef(..)), "{e}");
        let html = dir.path().join("page.gguf");
        std::fs::write(&html, b"<html>").unwrap();
        let e = s
            .create("x", &modelfile(&format!("FROM {}", html.display())))
            .unwrap_err();
        assert!(matches!(e, StoreError::NotGguf { .. }), "{e}");
        assert!(matches!(s.copy("nope", "y"), Err(StoreError::NotStored(_))));
    }
}
