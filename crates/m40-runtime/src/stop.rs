//! Stop strings: text is held back while it could be the start of one,
//! and cut at the first, which is never emitted.

/// Holds back text that could be the start of a stop string; cuts at the
/// first stop string, which is never emitted.
pub(crate) struct StopFilter {
    stops: Vec<String>,
    /// All text emitted so far.
    emitted: String,
    /// Decoded but not yet emitted.
    held: String,
    pub(crate) stopped: bool,
}

impl StopFilter {
    pub(crate) fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.to_vec(),
            emitted: String::new(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Add decoded text; returns what may be emitted now and whether a stop
    /// string was found.
    pub(crate) fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let out = self.held[..at].to_string();
            self.emitted.push_str(&out);
            self.held.clear();
            self.stopped = true;
            return (out, true);
        }
        // Keep the longest tail that is a prefix of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                self.stops
                    .iter()
                    .any(|s| !s.is_empty() && s.starts_with(&self.held[i..]))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep].to_string();
        self.held.drain(..keep);
        self.emitted.push_str(&out);
        (out, false)
    }

    /// The end of generation: everything held is text after all.
    pub(crate) fn finish(&mut self, text: &str) -> String {
        let (mut out, stopped) = self.push(text);
        if !stopped {
            out.push_str(&self.held);
            self.emitted.push_str(&self.held);
            self.held.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut f = StopFilter::new(&stops);
        let mut streamed = String::new();
        for p in pieces {
            let (out, stopped) = f.push(p);
            streamed.push_str(&out);
            if stopped {
                return (streamed, f.emitted, true);
            }
        }
        streamed.push_str(&f.finish(""));
        (streamed, f.emitted, false)
    }

    #[test]
    fn stop_strings_split_across_tokens_are_never_emitted() {
        assert_eq!(
            run(&["</answer>"], &["The ", "answer</an", "swer> more"]),
            ("The answer".into(), "The answer".into(), true)
        );
        assert_eq!(
            run(&["\n\n"], &["a\n", "\nb"]),
            ("a".into(), "a".into(), true)
        );
        // A held prefix that does not complete comes out later.
        assert_eq!(
            run(&["STOP"], &["x ST", "ART y"]),
            ("x START y".into(), "x START y".into(), false)
        );
        assert_eq!(
            run(&["STOP"], &["x ST"]),
            ("x ST".into(), "x ST".into(), false)
        );
        // The earliest of several stops wins; multibyte text stays whole.
        assert_eq!(
            run(&["é!", "b"], &["aé", "!b"]),
            ("a".into(), "a".into(), true)
        );
        assert_eq!(
            run(&[], &["plain"]),
            ("plain".into(), "plain".into(), false)
        );
    }
}
