//! llama.cpp's GBNF grammars (`grammar` on its server's routes) in
//! llguidance's Lark syntax, which the constraint engine compiles.
//!
//! GBNF: `name ::= alternatives`, one rule a line unless inside
//! parentheses; `"literals"` and `[character classes]` with `\n \t \r \\
//! \" \] \xHH \uHHHH \UHHHHHHHH` escapes, `.` for any character, `( )`,
//! `|`, `* + ?` and `{m}`, `{m,}`, `{m,n}`, `{,n}`; `#` comments; `root`
//! is the start. Each rule becomes one Lark rule (`root` is `start`),
//! literals JSON strings, classes and `.` regexes with every character
//! escaped.

use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Name(String),
    Define,
    Literal(String),
    /// Negated, and the (first, last) ranges.
    Class(bool, Vec<(char, char)>),
    Any,
    Open,
    Close,
    Pipe,
    /// `*`, `+`, `?` or a `{m,n}` repeat as Lark writes it.
    Op(String),
    /// The end of a rule (a newline outside parentheses).
    End,
}

/// The character an escape at `chars[i..]` (after its backslash) stands
/// for, and how many characters it took.
fn escape(chars: &[char], i: usize) -> Result<(char, usize), String> {
    let c = *chars.get(i).ok_or("a backslash at the end")?;
    let hex = |n: usize| -> Result<(char, usize), String> {
        let h: String = chars
            .get(i + 1..i + 1 + n)
            .ok_or("a short escape")?
            .iter()
            .collect();
        let v = u32::from_str_radix(&h, 16).map_err(|_| format!("\\{c}{h} is not hexadecimal"))?;
        Ok((
            char::from_u32(v).ok_or(format!("\\{c}{h} is not a character"))?,
            n + 1,
        ))
    };
    match c {
        'n' => Ok(('\n', 1)),
        't' => Ok(('\t', 1)),
        'r' => Ok(('\r', 1)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        _ => Ok((c, 1)),
    }
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\n' => {
                if depth == 0 && out.last().is_some_and(|t| *t != Tok::End) {
                    out.push(Tok::End);
                }
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            ':' if chars[i..].starts_with(&[':', ':', '=']) => {
                out.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("a literal without its closing quote".into()),
                        Some('"') => break,
                        Some('\\') => {
                            let (ch, n) = escape(&chars, i + 1)?;
                            s.push(ch);
                            i += 1 + n;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
                out.push(Tok::Literal(s));
            }
            '[' => {
                i += 1;
                let negated = chars.get(i) == Some(&'^');
                if negated {
                    i += 1;
                }
                let mut ranges = Vec::new();
                let item = |i: &mut usize| -> Result<char, String> {
                    match chars.get(*i) {
                        None => Err("a character class without its `]`".into()),
                        Some('\\') => {
                            let (ch, n) = escape(&chars, *i + 1)?;
                            *i += 1 + n;
                            Ok(ch)
                        }
                        Some(&ch) => {
                            *i += 1;
                            Ok(ch)
                        }
                    }
                };
                while chars.get(i) != Some(&']') {
                    let lo = item(&mut i)?;
                    let hi = if chars.get(i) == Some(&'-')
                        && chars.get(i + 1).is_some_and(|&c| c != ']')
                    {
                        i += 1;
                        item(&mut i)?
                    } else {
                        lo
                    };
                    if hi < lo {
                        return Err(format!("the range {lo:?}-{hi:?} runs backwards"));
                    }
                    ranges.push((lo, hi));
                }
                i += 1;
                out.push(Tok::Class(negated, ranges));
            }
            '.' => {
                out.push(Tok::Any);
                i += 1;
            }
            '(' => {
                depth += 1;
                out.push(Tok::Open);
                i += 1;
            }
            ')' => {
                depth = depth.checked_sub(1).ok_or("a `)` without its `(`")?;
                out.push(Tok::Close);
                i += 1;
            }
            '|' => {
                out.push(Tok::Pipe);
                i += 1;
            }
            '*' | '+' | '?' => {
                out.push(Tok::Op(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or("a `{` without its `}`")?;
                let inner: String = chars[i + 1..i + end]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                let (lo, hi) = match inner.split_once(',') {
                    Some((lo, hi)) => (lo.to_string(), Some(hi.to_string())),
                    None => (inner.clone(), None),
                };
                let num = |s: &str| {
                    s.parse::<u32>()
                        .map_err(|_| format!("the repeat {{{inner}}}"))
                };
                let lo = if lo.is_empty() { 0 } else { num(&lo)? };
                let op = match hi {
                    None => format!("{{{lo}}}"),
                    Some(h) if h.is_empty() => format!("{{{lo},}}"),
                    Some(h) => format!("{{{lo},{}}}", num(&h)?),
                };
                out.push(Tok::Op(op));
                i += end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '-' || chars[i] == '_')
                {
                    i += 1;
                }
                out.push(Tok::Name(chars[start..i].iter().collect()));
            }
            _ => return Err(format!("unexpected {c:?} in the grammar")),
        }
    }
    if depth != 0 {
        return Err("a `(` without its `)`".into());
    }
    Ok(out)
}

/// A regex character escaped for a Lark `/…/` class.
fn rx_char(c: char) -> String {
    if c.is_ascii_alphanumeric() {
        c.to_string()
    } else {
        format!("\\u{{{:x}}}", c as u32)
    }
}

/// `src` (GBNF) as a Lark grammar, or what stops it.
pub fn to_lark(src: &str) -> Result<String, String> {
    let toks = lex(src)?;
    // Rules: name ::= body, up to the next End.
    let mut rules: Vec<(String, &[Tok])> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == Tok::End {
            i += 1;
            continue;
        }
        let (Some(Tok::Name(name)), Some(Tok::Define)) = (toks.get(i), toks.get(i + 1)) else {
            return Err(format!("expected `name ::=` at {:?}", toks[i]));
        };
        let end = toks[i + 2..]
            .iter()
            .position(|t| *t == Tok::End)
            .map_or(toks.len(), |p| i + 2 + p);
        rules.push((name.clone(), &toks[i + 2..end]));
        i = end;
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err("the grammar has no `root` rule".into());
    }
    // GBNF names (letters, digits, '-', any case) as Lark rule names.
    let mut names: HashMap<String, String> = HashMap::new();
    let mut taken: Vec<String> = vec!["start".into()];
    for (n, _) in &rules {
        if names.contains_key(n) {
            continue;
        }
        let lark = if n == "root" {
            "start".to_string()
        } else {
            let base = format!("r_{}", n.to_ascii_lowercase().replace('-', "_"));
            let mut l = base.clone();
            let mut k = 2;
            while taken.contains(&l) {
                l = format!("{base}_{k}");
                k += 1;
            }
            l
        };
        taken.push(lark.clone());
        names.insert(n.clone(), lark);
    }
    // A rule defined twice gets the alternatives of both (as llama.cpp).
    let mut bodies: Vec<(String, Vec<String>)> = Vec::new();
    for (n, body) in &rules {
        let mut parts = Vec::new();
        let mut empty_alt = true;
        for t in body.iter() {
            let s = match t {
                Tok::Name(r) => names
                    .get(r)
                    .cloned()
                    .ok_or(format!("the rule `{r}` is used but never defined"))?,
                Tok::Define => return Err(format!("a `::=` inside the rule `{n}`")),
                Tok::Literal(l) => serde_json::to_string(l).map_err(|e| e.to_string())?,
                Tok::Class(neg, ranges) => {
                    let items: String = ranges
                        .iter()
                        .map(|&(a, b)| {
                            if a == b {
                                rx_char(a)
                            } else {
                                format!("{}-{}", rx_char(a), rx_char(b))
                            }
                        })
                        .collect();
                    if ranges.is_empty() {
                        // `[]` matches nothing, `[^]` any character.
                        if *neg {
                            "/(?s:.)/".into()
                        } else {
                            return Err("an empty character class".into());
                        }
                    } else {
                        format!("/[{}{items}]/", if *neg { "^" } else { "" })
                    }
                }
                Tok::Any => "/(?s:.)/".into(),
                Tok::Open => "(".into(),
                Tok::Close => ")".into(),
                Tok::Pipe => "|".into(),
                Tok::Op(o) => o.clone(),
                Tok::End => unreachable!("rules end before"),
            };
            // An empty alternative is the empty string.
            if matches!(t, Tok::Pipe | Tok::Close) && empty_alt {
                parts.push("\"\"".into());
            }
            empty_alt = matches!(t, Tok::Pipe | Tok::Open);
            parts.push(s);
        }
        if empty_alt {
            parts.push("\"\"".into());
        }
        let lark = names[n].clone();
        match bodies.iter_mut().find(|(l, _)| *l == lark) {
            Some((_, alts)) => alts.push(parts.join(" ")),
            None => bodies.push((lark, vec![parts.join(" ")])),
        }
    }
    Ok(bodies
        .into_iter()
        .map(|(l, alts)| format!("{l}: {}\n", alts.join(" | ")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::to_lark;

    #[test]
    fn rules_literals_classes_and_repeats() {
        let g = r#"
# a comment
root ::= "yes" | "no" ws-opt item{2,3}
ws-opt ::= | [ \t\n]
item ::= ( [^"\\] | "\\" ["\\/bfnrt] )+ .? [a-z]{,4}
"#;
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            concat!(
                "start: \"yes\" | \"no\" r_ws_opt r_item {2,3}\n",
                "r_ws_opt: \"\" | /[\\u{20}\\u{9}\\u{a}]/\n",
                "r_item: ( /[^\\u{22}\\u{5c}]/ | \"\\\\\" /[\\u{22}\\u{5c}\\u{2f}bfnrt]/ ) + /(?s:.)/ ? /[a-z]/ {0,4}\n",
            )
        );
    }

    #[test]
    fn multi_line_rules_inside_parentheses() {
        let g = "root ::= (\n  \"a\"\n  | \"b\"\n)\n";
        assert_eq!(to_lark(g).unwrap(), "start: ( \"a\" | \"b\" )\n");
    }

    #[test]
    fn errors_name_the_problem() {
        assert!(to_lark("item ::= \"x\"").unwrap_err().contains("root"));
        assert!(to_lark("root ::= missing").unwrap_err().contains("missing"));
        assert!(to_lark("root ::= \"open").unwrap_err().contains("quote"));
        assert!(to_lark("root ::= [z-a]").unwrap_err().contains("backwards"));
        assert!(to_lark("root ::= (\"a\"").unwrap_err().contains("("));
        assert!(to_lark("root ::= \"a\" ~").unwrap_err().contains('~'));
    }
}
