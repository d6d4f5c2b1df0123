//! Pre-tokenizer splits: which one each `tokenizer.ggml.pre` value names
//! (llama.cpp's llama-vocab.cpp) and the Hugging Face pre-tokenizer that
//! runs it.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use crate::error::{hf, Result};

/// The pre-tokenizer split a `tokenizer.ggml.pre` value names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreSplit {
    /// GPT-2's regex (ByteLevel with `use_regex`).
    Gpt2,
    /// Llama 3: one regex with 1-3 digit groups; BPE ignores merges for whole-vocab words.
    Llama3,
    /// Llama 3's regex with every word merged (DBRX, Smaug), as llama.cpp
    /// runs those types.
    Llama3Split,
    /// Qwen2: Llama 3's regex with single digits, NFC normalization.
    Qwen2,
    /// Qwen2's regex without NFC, as llama.cpp runs it for the other models
    /// of its type (StableLM 2, Hunyuan, Solar Open, ...).
    Qwen2Split,
    /// Qwen3.5: Qwen2's, with combining marks (\p{M}) inside words.
    Qwen35,
    /// GPT-4o's o200k split (Llama 4, MiniMax-M2, ...): words by case,
    /// contractions attached, 1-3 digit groups.
    Gpt4o,
    /// Mistral's Tekken: o200k's word split, single digits, no
    /// contractions; whole-vocabulary words skip the merges.
    Tekken,
    /// Single digits, then GPT-2's regex (StarCoder, Refact, Command-R, SmolLM).
    DigitsGpt2,
    /// Falcon: punctuation runs, GPT-2's regex, digit runs, triples of digits.
    Falcon,
    DeepseekCoder,
    DeepseekLlm,
    /// llama.cpp's default BPE split.
    Default,
    /// Jais 2: Llama 3's regex with whitespace runs cut at powers of two.
    Jais2,
    /// DeepSeek V3 (Hunyuan dense, HY v4, JoyAI): 1-3 digits, CJK runs,
    /// then words, punctuation and whitespace.
    Deepseek3,
    /// Spark 2.5: DeepSeek V3's with single digits and lone newlines.
    Spark25,
    /// Youtu: Korean, CJK punctuation, Bopomofo and CJK runs, then
    /// o200k-style words; whole-vocabulary words skip the merges.
    Youtu,
    /// BLOOM (Poro, GPT-3 Finnish): everything but whitespace and
    /// sentence punctuation, with one leading space.
    Bloom,
    /// Viking: BLOOM's with single digits.
    Viking,
    /// Chameleon: sentinel and image tokens, tabs and space pairs, single
    /// digits, single punctuation, then GPT-2's regex.
    Chameleon,
    /// Granite multilingual embeddings (97M): o200k's with combining marks in
    /// words; whole-vocabulary words skip the merges.
    GraniteEmbMulti,
    /// Tiny Aya (Cohere 2 MoE): digits in threes from the right, then o200k's.
    TinyAya,
    /// Kimi K2: Han runs apart from other letters, 1-3 digits.
    KimiK2,
    /// SuperBPE: digit runs in threes from the right, nothing else split.
    SuperBpe,
    /// Bailing MoE (Ling, LLaDA MoE): Qwen2's with one newline at a time.
    BailingMoe,
    /// Seed-Coder: Qwen2's without newlines in punctuation runs.
    SeedCoder,
    /// Ufakzeka: Qwen2's without contractions (Turkish suffixes after `'`).
    Ufakzeka,
    /// AFMoE: digits in threes from the right, Asian scripts apart, then
    /// DeepSeek V3's words.
    Afmoe,
    /// Laguna: lines, then Qwen2's split.
    Laguna,
    /// EXAONE MoE: words joined across single spaces, single digits.
    ExaoneMoe,
    /// MiniCPM 5: 1-3 digits, then Llama 3's regex with digit runs;
    /// whole-vocabulary words skip the merges.
    Minicpm5,
    /// Gemma 4 (Sarvam MoE, Granite multilingual embeddings 311M): raw UTF-8
    /// with spaces as `▁`, split only into runs of newlines and of the rest.
    SpmStyle,
    /// Runs of non-whitespace and of whitespace, raw UTF-8 (Jina's Chinese
    /// embeddings).
    Whitespace,
}

const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
// llama.cpp's regexes for its later pre types. Where llama.cpp runs one
// through std::regex it first collapses every letter to one class, so
// `\p{Lu}`, `\p{Ll}`, ... all read as `\p{L}` there: written so here.
const CONTRACTIONS: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const JAIS2_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}";
const CJK_KANA_RE: &str = "[一-龥぀-ゟ゠-ヿ]+";
const DEEPSEEK3_RE: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const SPARK25_RE: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##;
const YOUTU_ASIAN_RE: &str = "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+";
const YOUTU_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]*[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+[\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const BLOOM_RE: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
const GRANITE_EMB_MULTI_RE: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TINY_AYA_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]*[\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+[\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Digit runs in groups of three from the right (llama.cpp's custom AFMoE
/// split, also Tiny Aya's).
const DIGIT_GROUPS_RE: &str = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))";
/// llama.cpp's Han ranges (unicode_cpt_is_han).
const HAN: &str = r"\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2EBEF}\x{2F800}-\x{2FA1F}";
const BAILINGMOE_RE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const SEED_CODER_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const UFAKZEKA_RE: &str =
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const AFMOE_ASIAN_RE: &str = "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+";
const EXAONE_MOE_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const MINICPM5_RE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LINES_RE: &str = "[^\n]+|[\n]+";
const CJK_RE: &str = "[一-龥ࠀ-一가-퟿]+";
// The letters of deepseek-llm's tokenizer.json. Six of its characters are
// written as escapes: NFC (which an editor may apply to the source) maps
// them to other code points and turns their ranges inside out.
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌῐ-\x{1FD3}ῖ-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";
const DEEPSEEK_LLM_PUNCT: &str = r"\s?[!-/:-~！-／：-～‘-‟　-。]+";

impl PreSplit {
    /// The split for a `tokenizer.ggml.pre` value, or `None` if unknown.
    pub fn from_pre(pre: &str) -> Option<Self> {
        Some(match pre {
            "default" => PreSplit::Default,
            // Grouped as llama.cpp's llama-vocab.cpp groups them: each name
            // by its pre type, each type by the split it runs
            // (tests/llamacpp_vocab.rs checks the table against that file).
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" | "glm4" | "glm5" => PreSplit::Llama3,
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => PreSplit::Llama3Split,
            "qwen2" | "qwen2.5" | "qwen-2.5" | "deepseek-r1-qwen" => PreSplit::Qwen2,
            "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan" | "solar-open" | "grok-2" => {
                PreSplit::Qwen2Split
            }
            "qwen35" => PreSplit::Qwen35,
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => PreSplit::Gpt4o,
            "tekken" => PreSplit::Tekken,
            "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "phi-2" | "jina-es" | "jina-de"
            | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert"
            | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "trillion"
            | "granite-docling" => PreSplit::Gpt2,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => PreSplit::DigitsGpt2,
            "falcon" => PreSplit::Falcon,
            "deepseek-coder" => PreSplit::DeepseekCoder,
            "deepseek-llm" => PreSplit::DeepseekLlm,
            "jais-2" => PreSplit::Jais2,
            "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => PreSplit::Deepseek3,
            "spark2_5" => PreSplit::Spark25,
            "youtu" => PreSplit::Youtu,
            "poro-chat" | "bloom" | "gpt3-finnish" => PreSplit::Bloom,
            "viking" => PreSplit::Viking,
            "chameleon" => PreSplit::Chameleon,
            "granite-embed-multi-97m" => PreSplit::GraniteEmbMulti,
            "tiny_aya" | "cohere2moe" => PreSplit::TinyAya,
            "kimi-k2" => PreSplit::KimiK2,
            "superbpe" => PreSplit::SuperBpe,
            "bailingmoe" | "bailingmoe2" | "llada-moe" => PreSplit::BailingMoe,
            "seed-coder" => PreSplit::SeedCoder,
            "ufakzeka" => PreSplit::Ufakzeka,
            "afmoe" => PreSplit::Afmoe,
            "laguna" => PreSplit::Laguna,
            "exaone-moe" => PreSplit::ExaoneMoe,
            "minicpm5" => PreSplit::Minicpm5,
            "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" => PreSplit::SpmStyle,
            "whitespace" => PreSplit::Whitespace,
            _ => return None,
        })
    }

    /// Whether the split runs over GPT-2's byte characters (all but the
    /// raw UTF-8 ones: `SpmStyle`, `Whitespace`).
    pub fn byte_level(self) -> bool {
        !matches!(self, PreSplit::SpmStyle | PreSplit::Whitespace)
    }

    /// Whether a word that is a whole token skips the merges (llama.cpp's
    /// `ignore_merges`).
    pub fn ignores_merges(self) -> bool {
        matches!(
            self,
            PreSplit::Llama3
                | PreSplit::Tekken
                | PreSplit::Youtu
                | PreSplit::GraniteEmbMulti
                | PreSplit::Minicpm5
        )
    }
}

fn split(re: &str) -> Result<PreTokenizerWrapper> {
    let pattern = SplitPattern::Regex(re.to_string());
    Ok(Split::new(pattern, SplitDelimiterBehavior::Isolated, false)
        .map_err(hf)?
        .into())
}

fn byte_level(use_regex: bool) -> PreTokenizerWrapper {
    ByteLevel::new(false, true, use_regex).into()
}

pub(crate) fn pre_tokenizer(split_kind: PreSplit) -> Result<PreTokenizerWrapper> {
    let seq: Vec<PreTokenizerWrapper> = match split_kind {
        PreSplit::Gpt2 => vec![byte_level(true)],
        PreSplit::Llama3 | PreSplit::Llama3Split => vec![split(LLAMA3_RE)?, byte_level(false)],
        PreSplit::Qwen2 | PreSplit::Qwen2Split => vec![split(QWEN2_RE)?, byte_level(false)],
        PreSplit::Qwen35 => vec![split(QWEN35_RE)?, byte_level(false)],
        PreSplit::Gpt4o => vec![split(GPT4O_RE)?, byte_level(false)],
        PreSplit::Tekken => vec![split(TEKKEN_RE)?, byte_level(false)],
        PreSplit::DigitsGpt2 => vec![Digits::new(true).into(), byte_level(true)],
        PreSplit::Falcon => vec![
            Punctuation::new(SplitDelimiterBehavior::Contiguous).into(),
            byte_level(true),
            Digits::new(false).into(),
            split("[0-9][0-9][0-9]")?,
        ],
        PreSplit::DeepseekCoder => vec![
            split(r"[\r\n]")?,
            split(r"\s?\p{L}+")?,
            split(r"\s?\p{P}+")?,
            split(CJK_RE)?,
            Digits::new(true).into(),
            byte_level(false),
        ],
        PreSplit::DeepseekLlm => vec![
            split(r"[\r\n]")?,
            split(DEEPSEEK_LLM_LETTERS)?,
            split(DEEPSEEK_LLM_PUNCT)?,
            split(r"\s+$")?,
            split(CJK_RE)?,
            Digits::new(false).into(),
            byte_level(false),
        ],
        PreSplit::Default => vec![
            split(r"[\p{P}\$\+<=>\^~\|]+")?,
            split(GPT2_RE)?,
            Digits::new(false).into(),
            split("[0-9][0-9][0-9]")?,
            byte_level(false),
        ],
        PreSplit::Jais2 => vec![split(JAIS2_RE)?, byte_level(false)],
        PreSplit::Deepseek3 => vec![
            split(r"\p{N}{1,3}")?,
            split(CJK_KANA_RE)?,
            split(DEEPSEEK3_RE)?,
            byte_level(false),
        ],
        PreSplit::Spark25 => vec![
            split(r"\p{N}{1,3}")?,
            split(CJK_KANA_RE)?,
            split(SPARK25_RE)?,
            split(r"\p{N}")?,
            byte_level(false),
        ],
        PreSplit::Youtu => vec![split(YOUTU_ASIAN_RE)?, split(YOUTU_RE)?, byte_level(false)],
        PreSplit::Bloom => vec![split(BLOOM_RE)?, byte_level(false)],
        PreSplit::Viking => vec![split(BLOOM_RE)?, split(r"\p{N}")?, byte_level(false)],
        PreSplit::Chameleon => vec![
            split("<sentinel:[0-9]+>")?,
            split("(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z")?,
            split("([\t\n]|    |  )")?,
            split(r"\p{N}")?,
            split(r"[\p{P}!-/:-@\[-`{-~]")?,
            split(GPT2_RE)?,
            byte_level(false),
        ],
        PreSplit::GraniteEmbMulti => vec![split(GRANITE_EMB_MULTI_RE)?, byte_level(false)],
        PreSplit::TinyAya => vec![
            split(DIGIT_GROUPS_RE)?,
            split(TINY_AYA_RE)?,
            byte_level(false),
        ],
        PreSplit::KimiK2 => {
            // llama.cpp's hand-written K2 split: Han runs, then letters
            // other than Han (any case) with a contraction, 1-3 digits.
            let re = format!(
                r"[{HAN}]+|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}&&[^{HAN}]]+{CONTRACTIONS}?|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            );
            vec![split(&re)?, byte_level(false)]
        }
        PreSplit::SuperBpe => vec![
            split(r"\p{N}+")?,
            split(r"(?=(\d{3})+(?!\d))")?,
            byte_level(false),
        ],
        PreSplit::BailingMoe => vec![split(BAILINGMOE_RE)?, byte_level(false)],
        PreSplit::SeedCoder => vec![split(SEED_CODER_RE)?, byte_level(false)],
        PreSplit::Ufakzeka => vec![split(UFAKZEKA_RE)?, byte_level(false)],
        PreSplit::Afmoe => vec![
            split(DIGIT_GROUPS_RE)?,
            split(AFMOE_ASIAN_RE)?,
            split(DEEPSEEK3_RE)?,
            byte_level(false),
        ],
        PreSplit::Laguna => vec![split(LINES_RE)?, split(QWEN2_RE)?, byte_level(false)],
        PreSplit::ExaoneMoe => vec![split(EXAONE_MOE_RE)?, byte_level(false)],
        PreSplit::Minicpm5 => vec![
            split(r"\p{N}{1,3}")?,
            split(MINICPM5_RE)?,
            byte_level(false),
        ],
        PreSplit::SpmStyle => vec![split(LINES_RE)?],
        PreSplit::Whitespace => vec![split(r"\S+")?],
    };
    Ok(PreSequence::new(seq).into())
}
