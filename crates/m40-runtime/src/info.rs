//! What a model is, as a server or a CLI describes it: read from a GGUF
//! file's header (a stored model need not be loaded) or from a loaded
//! model, so that no caller opens GGUF files itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use m40_gguf::{GgufError, GgufFile, HyperParams};

/// A model's description.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ModelInfo {
    pub path: PathBuf,
    /// `general.architecture` ("llama"), or "unknown".
    pub architecture: String,
    pub n_params: u64,
    /// The tensor type that holds the most bytes ("Q4_K"): how Ollama
    /// names a model's quantization.
    pub quantization: String,
    pub file_size: u64,
    /// The file's modification time, where the file system gives one.
    pub modified: Option<SystemTime>,
    pub hparams: HyperParams,
    /// The model's chat template (Jinja), or the one m40-llm uses for a
    /// model without one ([`crate::DEFAULT_CHAT_TEMPLATE`]).
    pub chat_template: String,
    /// Ollama's capabilities: "completion" (a decoder); "embedding" where
    /// the file says how to pool (an encoder has only this one); "tools"
    /// where the chat template shows tools to the model; "thinking" where
    /// it marks reasoning; "insert" where the vocabulary has
    /// fill-in-the-middle tokens (a `suffix` is served).
    pub capabilities: Vec<&'static str>,
}

/// [`ModelInfo::capabilities`] of a model of `hp` whose template shows
/// tools and marks reasoning as `tools` and `thinking` say.
pub(crate) fn capabilities(
    hp: &HyperParams,
    tools: bool,
    thinking: bool,
    insert: bool,
) -> Vec<&'static str> {
    if hp.encoder.is_some() {
        return vec!["embedding"];
    }
    let mut c = vec!["completion"];
    if hp.pooling.is_some() {
        c.push("embedding");
    }
    if tools {
        c.push("tools");
    }
    if thinking {
        c.push("thinking");
    }
    if insert {
        c.push("insert");
    }
    c
}

impl ModelInfo {
    /// The description of the GGUF file at `path` (its header only).
    pub fn read(path: &Path) -> Result<ModelInfo, GgufError> {
        let f = GgufFile::open(path)?;
        let h = HyperParams::from_file(&f)?;
        Ok(Self::describe(&f, h))
    }

    /// The description of a loaded model.
    pub fn of(model: &m40_model::Model) -> ModelInfo {
        Self::describe(model.file(), model.hparams().clone())
    }

    fn describe(f: &GgufFile, hparams: HyperParams) -> ModelInfo {
        let mut bytes: HashMap<String, u64> = HashMap::new();
        for t in f.tensors() {
            *bytes.entry(t.ty.to_string()).or_default() += t.n_bytes;
        }
        // The most bytes; on a tie, the name that sorts first (the same
        // answer every time).
        let quantization = bytes
            .into_iter()
            .max_by(|(ta, a), (tb, b)| a.cmp(b).then(tb.cmp(ta)))
            .map(|(t, _)| t)
            .unwrap_or_default();
        let chat_template = f
            .metadata()
            .opt_str("tokenizer.chat_template")
            .ok()
            .flatten()
            .unwrap_or(crate::DEFAULT_CHAT_TEMPLATE)
            .to_string();
        let tool_use = f
            .metadata()
            .opt_str("tokenizer.chat_template.tool_use")
            .ok()
            .flatten();
        let (tools, thinking) = crate::chat::capabilities(&chat_template, tool_use);
        let vocab = f
            .metadata()
            .opt_str_array("tokenizer.ggml.tokens")
            .ok()
            .flatten();
        let insert = vocab.is_some_and(|v| {
            m40_tokenizer::fim_tokens_in(|t| v.iter().position(|x| x == t).map(|i| i as u32))
                .is_some()
        });
        let capabilities = capabilities(&hparams, tools, thinking, insert);
        ModelInfo {
            path: f.path().to_path_buf(),
            architecture: f.architecture().unwrap_or("unknown").to_string(),
            n_params: f.n_params(),
            quantization,
            file_size: f.file_size(),
            modified: std::fs::metadata(f.path()).and_then(|m| m.modified()).ok(),
            hparams,
            chat_template,
            capabilities,
        }
    }

    /// The parameter count as Ollama writes it: "1.2B", "135M".
    pub fn parameter_size(&self) -> String {
        let n = self.n_params as f64;
        match n >= 1e9 {
            true => format!("{:.1}B", n / 1e9),
            false => format!("{:.0}M", n / 1e6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use m40_gguf::synth::{write_model, FileType, Shape, SynthOptions};

    #[test]
    fn a_file_and_its_loaded_model_are_described_alike() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let opts = SynthOptions {
            shape: Shape::find("tiny").unwrap(),
            ty: FileType::All(m40_gguf::GgmlType::Q4_0),
            seed: 1,
        };
        write_model(f, &opts, |_, _| {}).unwrap();
        let read = ModelInfo::read(&path).unwrap();
        assert_eq!(read.architecture, "llama");
        assert_eq!(read.quantization, "Q4_0");
        assert_eq!(read.file_size, std::fs::metadata(&path).unwrap().len());
        assert!(read.n_params > 0 && read.modified.is_some());
        assert_eq!(read.chat_template, crate::DEFAULT_CHAT_TEMPLATE);
        let model = m40_model::Model::open(&path).unwrap();
        let of = ModelInfo::of(&model);
        assert_eq!(
            (of.n_params, of.quantization, of.hparams.n_layer, of.path),
            (
                read.n_params,
                read.quantization.clone(),
                read.hparams.n_layer,
                read.path.clone()
            )
        );
        // No fill-in-the-middle tokens in its vocabulary: no "insert".
        assert_eq!(read.capabilities, ["completion"]);
        let vocab: Vec<&str> = vec![
            "a",
            "<|fim_prefix|>",
            "b",
            "<|fim_middle|>",
            "<|fim_suffix|>",
        ];
        let id = |t: &str| vocab.iter().position(|v| *v == t).map(|i| i as u32);
        assert_eq!(m40_tokenizer::fim_tokens_in(id), Some([1, 4, 3]));
        assert_eq!(
            m40_tokenizer::fim_tokens_in(|t| id(t).filter(|&i| i != 4)),
            None
        );
        assert_eq!(
            capabilities(&read.hparams, false, false, true),
            ["completion", "insert"]
        );
        assert!(matches!(
            ModelInfo::read(&dir.path().join("missing.gguf")),
            Err(GgufError::Io { .. })
        ));
    }
}
