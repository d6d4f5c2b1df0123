//! Request fields of issue 57, points 5 and 6, on both backends: a chat
//! that outgrows the context loses its oldest turns after the system
//! message, as Ollama's `truncate` does, and still answers (one that may
//! not is refused); a continuation (`Request::prefix`, Ollama's `context`)
//! keeps the ids; `logit_bias` bans and forces tokens (on the GPU through
//! the host-sampled row); a fill-in-the-middle prompt needs FIM tokens; an
//! answer that fills the context shifts and goes on (Ollama's `shift`).

mod support;

use m40_runtime::{
    CancelToken, EngineError, FinishReason, Format, Message, Prompt, Request, SamplingParams,
};
use support::On;

on_both!(
    old_turns_are_dropped_to_fit,
    prefix_ids_continue_a_conversation,
    logit_bias_bans_and_forces,
    a_cut_answer_never_ends_inside_a_character,
    an_answer_that_fills_the_context_shifts,
);

fn long_chat(turns: usize) -> Vec<Message> {
    let mut m = vec![Message::new("system", "You are Zed, a terse helper.")];
    for i in 0..turns {
        m.push(Message::new(
            "user",
            format!("Question {i}: tell me about the number {i} at length."),
        ));
        m.push(Message::new(
            "assistant",
            format!("The number {i} is a number. ").repeat(8),
        ));
    }
    m.push(Message::new("user", "Last question: what is your name?"));
    m
}

fn old_turns_are_dropped_to_fit(on: On) {
    let e = support::smollm2_engine(on, 1024);
    let mut r = Request::new(Prompt::Chat(long_chat(40)));
    r.max_tokens = Some(16);
    let err = e.prepare(r.clone()).unwrap_err();
    assert!(matches!(err, EngineError::ContextOverflow { .. }), "{err}");
    r.drop_old_turns = true;
    let p = e.prepare(r.clone()).unwrap();
    assert!(
        p.dropped_messages() > 0 && p.dropped_messages().is_multiple_of(2),
        "{}",
        p.dropped_messages()
    );
    assert!(p.prompt_tokens().len() + 16 <= e.n_ctx());
    let text = e.tokenizer().decode(p.prompt_tokens()).unwrap();
    assert!(text.contains("You are Zed"), "the system message stays");
    assert!(text.contains("Last question"), "the last message stays");
    assert!(!text.contains("Question 0:"), "the oldest turn goes");
    let kept = 41 * 2 - 1 - p.dropped_messages();
    assert!(text.contains(&format!("Question {}:", 39)), "{kept} kept");
    let d = e.start(&p, &CancelToken::new()).finish().unwrap();
    assert!(!d.token_ids.is_empty());
    // A chat that fits is left whole.
    let mut short = Request::new(Prompt::Chat(long_chat(2)));
    short.drop_old_turns = true;
    assert_eq!(e.prepare(short).unwrap().dropped_messages(), 0);
}

fn prefix_ids_continue_a_conversation(on: On) {
    let e = support::smollm2_engine(on, 1024);
    let first = Request::new(Prompt::Chat(vec![Message::new(
        "user",
        "My name is Zebulon.",
    )]));
    let p = e.prepare(first).unwrap();
    let mut r = Request::new(Prompt::Chat(vec![Message::new("user", "What is my name?")]));
    r.max_tokens = Some(4);
    let alone = e.prepare(r.clone()).unwrap().prompt_tokens().to_vec();
    r.prefix = p.prompt_tokens().to_vec();
    let joined = e.prepare(r.clone()).unwrap();
    // The prefix, then the new prompt (less a BOS the engine would add).
    let ids = joined.prompt_tokens();
    assert_eq!(&ids[..r.prefix.len()], &r.prefix[..]);
    let rest = &ids[r.prefix.len()..];
    assert!(
        rest == &alone[..] || rest == &alone[1..],
        "{rest:?} vs {alone:?}"
    );
    r.prefix = vec![u32::MAX];
    assert!(e.prepare(r).is_err(), "ids past the vocabulary are refused");
}

fn logit_bias_bans_and_forces(on: On) {
    let e = support::smollm2_engine(on, 1024);
    let mut r = Request::new(Prompt::Text("The capital of France is".into()));
    r.max_tokens = Some(6);
    r.sampling = {
        let mut o = SamplingParams::default();
        o.temperature = 0.0;
        o
    };
    let run = |r: &Request| {
        e.generate(r, &CancelToken::new(), |_| {})
            .unwrap()
            .token_ids
    };
    let free = run(&r);
    // Banned, the greedy first token is another.
    r.logit_bias = vec![(free[0], -100.0)];
    let banned = run(&r);
    assert_ne!(banned[0], free[0]);
    assert!(!banned.contains(&free[0]));
    // Sampled with a large bias, one token is all there is.
    let x = e.tokenizer().token_id("x").unwrap();
    r.logit_bias = vec![(x, 100.0)];
    r.sampling = {
        let mut o = SamplingParams::default();
        o.temperature = 1.0;
        o.seed = Some(3);
        o
    };
    assert_eq!(run(&r), vec![x; 6]);
    // Fill in the middle needs FIM tokens, which SmolLM2 has not.
    let infill = Request::new(Prompt::Infill {
        prefix: "def f(".into(),
        suffix: "return x".into(),
    });
    assert!(matches!(e.prepare(infill), Err(EngineError::NoInfill)));
}

fn a_cut_answer_never_ends_inside_a_character(on: On) {
    let e = support::smollm2_engine(on, 1024);
    // A grammar makes the model write CJK characters, several byte tokens
    // each; cut after every count of tokens, the text is whole characters.
    let target = "日本語の文字";
    let mut r = Request::new(Prompt::Text("Write:".into()));
    r.format = Some(Format::Lark(format!("start: {target:?}")));
    let mut cut_inside = 0;
    for n in 1..=12 {
        r.max_tokens = Some(n);
        let d = e.generate(&r, &CancelToken::new(), |_| {}).unwrap();
        assert!(!d.text.contains('\u{FFFD}'), "{n} tokens: {:?}", d.text);
        assert!(target.starts_with(&d.text), "{n} tokens: {:?}", d.text);
        if d.finish_reason == FinishReason::Length {
            let whole = e.tokenizer().decode(&d.token_ids).unwrap();
            cut_inside += usize::from(whole.ends_with('\u{FFFD}'));
        }
    }
    assert!(cut_inside > 0, "no cut fell inside a character");
}

fn an_answer_that_fills_the_context_shifts(on: On) {
    // Its own engine: it checks that nothing is left running after it.
    let own = support::own_smollm2_engine(on, 1024);
    let e = &own;
    let greedy = {
        let mut o = SamplingParams::default();
        o.temperature = 0.0;
        o.repeat_penalty = 1.0;
        o
    };
    let mut r = Request::new(Prompt::Text("Count with me: one, two, three,".into()));
    r.sampling = greedy.clone();
    r.context = Some(64);
    r.ignore_eos = true;
    r.max_tokens = Some(150);
    // Without shift the answer stops where the 64-token context ends.
    r.fit_max_tokens = true;
    let prompt = e.prompt_tokens(&r.prompt).unwrap();
    let cut = e.generate(&r, &CancelToken::new(), |_| {}).unwrap();
    assert_eq!(cut.token_ids.len(), 64 - prompt.len());
    assert_eq!(cut.finish_reason, FinishReason::Length);
    // With it, past the context: 150 tokens, two shifts and more.
    r.shift = true;
    let long = e.generate(&r, &CancelToken::new(), |_| {}).unwrap();
    assert_eq!(long.token_ids.len(), 150);
    assert_eq!(long.finish_reason, FinishReason::Length);
    assert_eq!(long.token_ids[..cut.token_ids.len()], cut.token_ids[..]);
    support::idle(e);
    if let On::Gpu = on {
        return;
    }
    // The first shift kept the first 4 tokens and the newer half of the
    // rest: what follows is what a fresh start from those tokens gives
    // (bitwise on the CPU).
    let all: Vec<u32> = prompt.iter().chain(&long.token_ids).copied().collect();
    let kept: Vec<u32> = all[..4].iter().chain(&all[34..64]).copied().collect();
    let mut fresh = Request::new(Prompt::Text(String::new()));
    fresh.prefix = kept;
    fresh.sampling = greedy;
    fresh.ignore_eos = true;
    fresh.max_tokens = Some(12);
    let again = e.generate(&fresh, &CancelToken::new(), |_| {}).unwrap();
    assert_eq!(again.token_ids[..], all[64..76]);
}
