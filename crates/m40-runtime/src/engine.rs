//! The engine: a model, its tokenizer and chat template, a backend, and
//! generation requests that stream tokens.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use m40_chat::{Format, FormatError, Grammars};
use m40_model::{AnyBackend, Backend, Model};
use m40_tokenizer::template::ChatTemplate;

use m40_tokenizer::{Encode, Tokenizer};

use crate::batcher::{Batcher, Core, LaneSpec, Limits, Load, Submission};
use crate::cancel::CancelToken;
use crate::chat::{ChatFormat, Plan};
use crate::error::{EngineError, Result};
use crate::generation::Generation;
use crate::prepared::Prepared;
use crate::request::{Prompt, Request, TokenEvent};
use crate::Completion;

pub use crate::options::{
    BackendChoice, EngineOptions, KernelProgress, UploadProgress, DEFAULT_GPU_SEQUENCES,
    DEFAULT_SEQUENCES,
};

/// A loaded model ready to generate, from any number of threads at once:
/// their requests run together in batched steps (continuous batching;
/// each one's tokens are those it would get alone).
pub struct Engine {
    model: Arc<Model>,
    pub(crate) core: Arc<Core>,
    /// Why Auto chose the CPU, if it did.
    note: Option<String>,
    /// Where the planner put the layers, where it was asked (several GPUs,
    /// `gpu_layers`, `tensor_split`, `max_vram`) or the model did not fit one GPU.
    placement: Option<m40_model::placement::Placement>,
    chat: ChatFormat,
    pub(crate) n_ctx: usize,
    pub(crate) batcher: Batcher,
    /// The vocabulary's grammar compiler, built for the first structured
    /// output.
    grammars: OnceLock<Result<Arc<Grammars>, FormatError>>,
}

/// The context when none is asked for, where the model allows as much:
/// Ollama's default, which keeps an 8B model's KV cache at 0.5 GiB.
pub const DEFAULT_CONTEXT: usize = m40_model::DEFAULT_CONTEXT;

/// The context `asked` (see [`EngineOptions::n_ctx`]) for a model of `hp`.
fn context_length(hp: &m40_gguf::HyperParams, asked: Option<usize>) -> Result<usize> {
    let max = hp.max_context();
    match asked {
        None => Ok(max.min(DEFAULT_CONTEXT)),
        Some(0) => Ok(max),
        Some(n) if n > max => Err(EngineError::ContextTooLong { asked: n, max }),
        Some(n) => Ok(n),
    }
}

/// The step loops of backend `i` of an engine: `opts.steps_in_flight`
/// (default one), each on its share of the pool's pages (a context at
/// least), so that while one's step runs on a stage of a split model
/// another's runs on the next.
fn lanes_of(
    i: usize,
    backend: &AnyBackend,
    opts: &EngineOptions,
    hp: &m40_gguf::HyperParams,
    n_ctx: usize,
) -> Vec<LaneSpec> {
    let l = limits_of(backend, opts, hp);
    let room = (l.pages * l.page_tokens / n_ctx.max(1)).max(1);
    let n = opts.steps_in_flight.unwrap_or(1).clamp(1, room);
    let pages = l.pages / n;
    (0..n)
        .map(|k| LaneSpec {
            backend: i,
            limits: Limits {
                pages,
                parallel: l.parallel.div_ceil(n),
                ..l.clone()
            },
            page_offset: (k * pages) as u32,
        })
        .collect()
}

/// The step loop's limits for `backend`.
fn limits_of(backend: &AnyBackend, opts: &EngineOptions, hp: &m40_gguf::HyperParams) -> Limits {
    let (layout, pages) = backend.kv_pool();
    let page_tokens = layout.page_tokens;
    // At most what one step of the backend takes, so that every plan
    // runs as one step (Backend::step_limits).
    let parallel = opts
        .parallel
        .unwrap_or((pages * page_tokens / 256).clamp(1, 64))
        .clamp(1, backend.step_limits().seqs);
    Limits {
        // An encoder's input runs in one step: by default as long a
        // step as the backend takes, so that a whole context fits.
        max_batch_tokens: opts
            .max_batch_tokens
            .unwrap_or(match hp.encoder {
                Some(_) => backend.max_step(),
                None => backend.step_tokens(),
            })
            .clamp(1, backend.max_step()),
        parallel,
        page_tokens,
        pages,
        prefix_cache: !opts.no_prefix_cache,
        step_stats: opts.step_stats.filter(|&n| n > 0),
    }
}

impl Engine {
    /// Load the GGUF file at `path` (a store name is resolved to one by
    /// the m40-store crate: `Store::from_env()?.resolve(name, ..)`).
    pub fn from_path(path: &Path, opts: EngineOptions) -> Result<Self> {
        let model = Model::open(path)?;
        let n_ctx = context_length(model.hparams(), opts.n_ctx)?;
        let model = Arc::new(model.with_context(n_ctx));
        let tokenizer = Tokenizer::from_gguf(model.file())?;
        let (template, source) = match &opts.chat_template {
            Some(src) => (ChatTemplate::new(src)?, src.clone()),
            None => (
                tokenizer.chat_template()?,
                tokenizer
                    .vocab()
                    .chat_template
                    .clone()
                    .unwrap_or_else(|| m40_tokenizer::template::CHATML.to_string()),
            ),
        };
        let tool_use = match &opts.chat_template {
            Some(_) => None,
            None => model
                .file()
                .metadata()
                .opt_str("tokenizer.chat_template.tool_use")
                .ok()
                .flatten()
                .map(str::to_string),
        };
        let chat = ChatFormat::new(template, &source, tool_use.as_deref(), &tokenizer);
        let (backends, note, placement) = match opts.replicas {
            true => (
                crate::pick::load_replicas(&model, &opts, n_ctx)?,
                None,
                None,
            ),
            false => {
                let (b, note, placement) = crate::pick::load_backend(&model, &opts, n_ctx)?;
                (vec![b], note, placement)
            }
        };
        let mut lanes = Vec::new();
        for (i, b) in backends.iter().enumerate() {
            lanes.extend(lanes_of(i, b, &opts, model.hparams(), n_ctx));
        }
        let core = Arc::new(Core {
            backends,
            tokenizer,
        });
        let batcher = Batcher::start(core.clone(), lanes).map_err(EngineError::Thread)?;
        Ok(Self {
            core,
            note,
            placement,
            model,
            chat,
            n_ctx,
            batcher,
            grammars: OnceLock::new(),
        })
    }

    /// The grammar compiler of this model's vocabulary (built once).
    pub fn grammars(&self) -> Result<Arc<Grammars>> {
        let g = self
            .grammars
            .get_or_init(|| Grammars::new(&self.core.tokenizer).map(Arc::new));
        Ok(g.clone()?)
    }

    /// Sequences waiting and running now, and the KV pages they hold.
    pub fn activity(&self) -> Load {
        self.batcher.load()
    }

    /// The memory its backend holds: weights, KV pool and workspace, on
    /// the GPU or in host memory.
    pub fn memory(&self) -> crate::MemoryUse {
        let mut all = self.core.backend().memory();
        for b in &self.core.backends[1..] {
            let m = b.memory();
            all.weights += m.weights;
            all.kv += m.kv;
            all.workspace += m.workspace;
        }
        all
    }

    /// The part of [`Engine::memory`] in GPU memory: all of it on a GPU,
    /// none on the CPU, the GPU stages' where the model is split.
    pub fn memory_on_gpus(&self) -> u64 {
        self.core.backends.iter().map(|b| b.gpu_memory()).sum()
    }

    /// "CPU" or the GPU's name (each replica's, where there are several).
    pub fn backend_name(&self) -> String {
        match self.core.backends.len() {
            1 => self.core.backend().describe(),
            n => {
                let each: Vec<String> = self.core.backends.iter().map(|b| b.describe()).collect();
                format!("{n} replicas: {}", each.join(", "))
            }
        }
    }

    /// Sequences waiting and running on each replica (one entry without
    /// replicas).
    pub fn replica_loads(&self) -> Vec<usize> {
        self.batcher.replica_loads()
    }

    /// Why the engine runs on the CPU although the GPU was allowed, if so.
    pub fn backend_note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// Where each layer runs and what each device holds, where the
    /// placement planner decided it ([`EngineOptions::gpus`] and the
    /// options beside it, or a model too large for one GPU); its `Display`
    /// is the table `m40-llm` prints.
    pub fn placement(&self) -> Option<&m40_model::placement::Placement> {
        self.placement.as_ref()
    }

    /// The model (its file, hyperparameters and tensors), which outlives
    /// the engine where a caller keeps it.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The model's GGUF file (metadata, tensors, path).
    pub fn model_file(&self) -> &m40_gguf::GgufFile {
        self.model.file()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.core.tokenizer
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    pub fn hparams(&self) -> &m40_gguf::HyperParams {
        self.core.backend().hparams()
    }

    /// The prompt's token ids.
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        Ok(self.render(&Request::new(prompt.clone()))?.0)
    }

    /// Whether the model's own chat template shows tools to it (Ollama's
    /// `tools` capability). Any model can call tools: one whose template
    /// does not gets them in a system message, its answer constrained to
    /// JSON calls or a reply (llama.cpp's generic format).
    pub fn native_tools(&self) -> bool {
        self.chat.native_tools()
    }

    /// How the model marks its reasoning, where it thinks.
    pub fn thinking(&self) -> Option<m40_chat::Thinking> {
        self.chat.thinking()
    }

    /// The model's description, with the chat template this engine renders
    /// (the model's, or the one it was loaded with) and what it allows.
    pub fn info(&self) -> crate::ModelInfo {
        let mut info = crate::ModelInfo::of(&self.model);
        info.chat_template = self.chat.source().to_string();
        info.capabilities = crate::info::capabilities(
            self.hparams(),
            self.native_tools(),
            self.thinking().is_some(),
            self.tokenizer().fim_tokens().is_some(),
        );
        info
    }

    /// A request's prompt tokens, how its answer is read, and the format
    /// its tool choice forces.
    fn render(&self, req: &Request) -> Result<(Vec<u32>, Plan, Option<Format>)> {
        let tok = &self.core.tokenizer;
        let (text, bos, plan, format) = match &req.prompt {
            Prompt::Text(t) => (t.clone(), true, Plan::default(), req.format.clone()),
            Prompt::Infill { prefix, suffix } => {
                let [pre, suf, mid] = tok.fim_tokens().ok_or(EngineError::NoInfill)?;
                let plain = Encode {
                    parse_special: false,
                    add_special: false,
                };
                let mut ids: Vec<u32> = tok
                    .bos()
                    .filter(|_| tok.vocab().add_bos)
                    .into_iter()
                    .collect();
                ids.push(pre);
                ids.extend(tok.encode(prefix, plain)?);
                ids.push(suf);
                ids.extend(tok.encode(suffix, plain)?);
                ids.push(mid);
                return Ok((ids, Plan::default(), req.format.clone()));
            }
            Prompt::Chat(m) => {
                let (text, plan, format) =
                    self.chat.render(m, req, tok.render_options(true), tok)?;
                // Templates that write the BOS string themselves get no second one.
                let has_bos = tok
                    .bos()
                    .and_then(|b| tok.piece(b))
                    .is_some_and(|b| !b.is_empty() && text.starts_with(b));
                (text, !has_bos, plan, format)
            }
        };
        let mut ids = tok.encode(
            &text,
            Encode {
                parse_special: true,
                add_special: bos && req.prefix.is_empty(),
            },
        )?;
        if !req.prefix.is_empty() {
            tok.check(&req.prefix)?;
            ids.splice(0..0, req.prefix.iter().copied());
        }
        Ok((ids, plan, format))
    }

    /// Prepare and run a request, calling `on_token` for every generated
    /// token (see [`Engine::start`] for how it ends).
    pub fn generate(
        &self,
        req: &Request,
        cancel: &CancelToken,
        mut on_token: impl FnMut(&TokenEvent),
    ) -> Result<Completion> {
        let mut run = self.start(&self.prepare(req.clone())?, cancel);
        for token in &mut run {
            on_token(&token);
        }
        run.finish()
    }

    /// Check `req` (its sampling parameters), tokenize its prompt and fit
    /// it and `max_tokens` into the context: every request passes here,
    /// once.
    pub fn prepare(&self, mut request: Request) -> Result<Prepared> {
        if self.hparams().encoder.is_some() {
            return Err(EngineError::EmbeddingOnly(self.hparams().arch.name()));
        }
        request.sampling.validate()?;
        let biased: Vec<u32> = request.logit_bias.iter().map(|b| b.0).collect();
        self.core.tokenizer.check(&biased)?;
        let n_ctx = request.context.map_or(self.n_ctx, |c| c.min(self.n_ctx));
        let (mut prompt, plan, format, dropped) = self.render_fitted(&mut request, n_ctx)?;
        let constraint = match &format {
            Some(f) => Some(self.grammars()?.compile(f)?),
            None => None,
        };
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let room = n_ctx.saturating_sub(prompt.len());
        // A shifting answer may outgrow the context; another must fit it
        // (or, where the request allows, is cut to, or cuts the prompt).
        let shifts = request.shift;
        if room == 0 && (shifts || (request.fit_max_tokens && !request.truncate_prompt)) {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                n_ctx,
            });
        }
        let mut max_tokens = match shifts {
            true => request
                .max_tokens
                .unwrap_or(n_ctx * crate::request::SHIFT_MAX_CONTEXTS),
            false => request.max_tokens.unwrap_or(room),
        };
        if request.fit_max_tokens && !request.truncate_prompt && !shifts {
            max_tokens = max_tokens.min(room);
        }
        if !shifts && (prompt.len() + max_tokens > n_ctx || prompt.len() >= n_ctx) {
            if !request.truncate_prompt {
                return Err(EngineError::ContextOverflow {
                    prompt: prompt.len(),
                    max_tokens,
                    n_ctx,
                });
            }
            let keep = n_ctx.saturating_sub(max_tokens.max(1)).max(1);
            prompt.drain(..prompt.len() - keep.min(prompt.len()));
            max_tokens = max_tokens.min(n_ctx - prompt.len());
        }
        Ok(Prepared {
            request,
            prompt,
            max_tokens,
            constraint,
            plan,
            dropped,
            n_ctx,
        })
    }

    /// [`Engine::render`], with a chat's oldest turns dropped until it fits
    /// `n_ctx` with room to answer where the request allows it; and how
    /// many messages were dropped.
    fn render_fitted(
        &self,
        req: &mut Request,
        n_ctx: usize,
    ) -> Result<(Vec<u32>, Plan, Option<Format>, usize)> {
        let (ids, plan, format) = self.render(req)?;
        let room = req
            .max_tokens
            .unwrap_or(n_ctx / 4)
            .clamp(1, (n_ctx / 2).max(1));
        let Prompt::Chat(messages) = &req.prompt else {
            return Ok((ids, plan, format, 0));
        };
        if !req.drop_old_turns || ids.len() + room <= n_ctx {
            return Ok((ids, plan, format, 0));
        }
        let mut kept = messages.clone();
        let mut fitted = (ids, plan, format);
        let before = kept.len();
        while fitted.0.len() + room > n_ctx {
            // The oldest turn after the system messages: a user message and
            // what follows it up to the next one, never the last user message.
            let Some(first) = kept.iter().position(|m| m.role != "system") else {
                break;
            };
            let next = kept[first + 1..]
                .iter()
                .position(|m| m.role == "user")
                .map(|p| first + 1 + p);
            let Some(next) = next else { break };
            kept.drain(first..next);
            req.prompt = Prompt::Chat(kept.clone());
            fitted = self.render(req)?;
        }
        Ok((fitted.0, fitted.1, fitted.2, before - kept.len()))
    }

    /// Start a prepared request: it runs in the engine's steps together
    /// with every other request in flight (its tokens are those it would
    /// get alone), and the returned [`Generation`] yields its tokens as they
    /// are sampled. It ends at an end-of-generation token or stop string
    /// ([`FinishReason::Stop`]), at its `max_tokens` or a full context
    /// ([`FinishReason::Length`]), or when `cancel` fires, the generation
    /// is cancelled or dropped ([`FinishReason::Cancelled`]).
    pub fn start(&self, prepared: &Prepared, cancel: &CancelToken) -> Generation {
        let req = &prepared.request;
        let own = cancel.child();
        let (tx, rx) = flume::unbounded();
        self.batcher.submit(Submission {
            prompt: prepared.prompt.clone(),
            max_new: prepared.max_tokens,
            sampling: req.sampling.clone(),
            logprobs: req.logprobs.is_some(),
            logit_bias: req.logit_bias.clone(),
            ignore_eos: req.ignore_eos,
            constraint: prepared.constraint.clone(),
            hidden: false,
            shift: req.shift.then_some(prepared.n_ctx),
            cancel: own.clone(),
            events: tx,
        });
        Generation::new(self.core.clone(), prepared, rx, own)
    }
}
