//! Replacing byte strings in a stream: secrets by their placeholders in
//! what comes back from an upstream, placeholders by secrets on the way
//! out. A match split across two chunks is still found: the last bytes of
//! a chunk that could start one are held back until the next chunk (or
//! the end) shows whether they do.

use aho_corasick::{AhoCorasick, MatchKind};

/// A set of `(from, to)` replacements, applied to a stream.
#[derive(Debug, Clone)]
pub struct Replacer {
    finder: AhoCorasick,
    to: Vec<Vec<u8>>,
    /// The longest `from`, less one: the most bytes a chunk may hold back.
    hold: usize,
}

impl Replacer {
    /// `None` when there is nothing to replace (no pairs, or only empty
    /// `from`s, which are dropped).
    pub fn new(pairs: &[(Vec<u8>, Vec<u8>)]) -> Option<Replacer> {
        let pairs: Vec<&(Vec<u8>, Vec<u8>)> = pairs.iter().filter(|(from, _)| !from.is_empty()).collect();
        if pairs.is_empty() {
            return None;
        }
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(pairs.iter().map(|(from, _)| from))
            .ok()?;
        let hold = pairs.iter().map(|(from, _)| from.len()).max().unwrap_or(1) - 1;
        Some(Replacer { finder, to: pairs.iter().map(|(_, to)| to.clone()).collect(), hold })
    }

    /// Every match in a whole value replaced.
    pub fn replace_all(&self, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(value.len());
        self.finder.replace_all_with_bytes(value, &mut out, |m, _, out| {
            out.extend_from_slice(&self.to[m.pattern().as_usize()]);
            true
        });
        out
    }

    /// Whether `value` holds a match.
    pub fn finds(&self, value: &[u8]) -> bool {
        self.finder.is_match(value)
    }

    /// A stream's state: the bytes held back so far.
    pub fn stream(&self) -> ReplaceStream {
        ReplaceStream { replacer: self.clone(), held: Vec::new(), replaced: 0 }
    }
}

/// One stream through a [`Replacer`]: feed chunks in order, then finish.
#[derive(Debug)]
pub struct ReplaceStream {
    replacer: Replacer,
    held: Vec<u8>,
    /// How many matches were replaced.
    pub replaced: u64,
}

impl ReplaceStream {
    /// The output for `chunk`: everything that can no longer be the start
    /// of a match, replaced.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        // A match starting before `safe` ends within what is held, so it
        // is found now; one starting later may still be incomplete.
        let safe = self.held.len().saturating_sub(self.replacer.hold);
        let mut out = Vec::with_capacity(self.held.len());
        let mut at = 0;
        for m in self.replacer.finder.find_iter(&self.held) {
            if m.start() >= safe {
                break;
            }
            out.extend_from_slice(&self.held[at..m.start()]);
            out.extend_from_slice(&self.replacer.to[m.pattern().as_usize()]);
            self.replaced += 1;
            at = m.end();
        }
        let keep_from = at.max(safe);
        out.extend_from_slice(&self.held[at..keep_from]);
        self.held.drain(..keep_from);
        out
    }

    /// What is still held, replaced: the stream's last bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::with_capacity(held.len());
        let mut at = 0;
        for m in self.replacer.finder.find_iter(&held) {
            out.extend_from_slice(&held[at..m.start()]);
            out.extend_from_slice(&self.replacer.to[m.pattern().as_usize()]);
            self.replaced += 1;
            at = m.end();
        }
        out.extend_from_slice(&held[at..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secret_replacer() -> Replacer {
        Replacer::new(&[(b"s3cr3t-value".to_vec(), b"$TOKEN".to_vec()), (b"other".to_vec(), b"$OTHER".to_vec())]).unwrap()
    }

    #[test]
    fn a_match_split_across_chunks_is_replaced() {
        let r = secret_replacer();
        let mut s = r.stream();
        let mut out = s.feed(b"auth: s3cr");
        assert!(b"auth: ".starts_with(&out), "the bytes that may start a match wait");
        out.extend(s.feed(b"3t-value and oth"));
        out.extend(s.feed(b"er."));
        out.extend(s.finish());
        assert_eq!(out, b"auth: $TOKEN and $OTHER.");
        assert_eq!(s.replaced, 2);
    }

    #[test]
    fn nothing_to_replace_is_no_replacer() {
        assert!(Replacer::new(&[]).is_none());
        assert!(Replacer::new(&[(Vec::new(), b"x".to_vec())]).is_none());
    }

    proptest! {
        /// However a stream is cut, the output is the whole replacement.
        #[test]
        fn chunking_does_not_change_the_output(
            parts in proptest::collection::vec(prop_oneof![
                Just(b"s3cr3t-value".to_vec()), Just(b"s3cr3t".to_vec()), Just(b"other".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..8)], 0..20),
            cuts in proptest::collection::vec(0usize..200, 0..10),
        ) {
            let r = secret_replacer();
            let input: Vec<u8> = parts.concat();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= input.len()).collect();
            cuts.sort_unstable();
            let mut s = r.stream();
            let (mut out, mut at) = (Vec::new(), 0);
            for c in cuts {
                out.extend(s.feed(&input[at..c]));
                at = c;
            }
            out.extend(s.feed(&input[at..]));
            out.extend(s.finish());
            prop_assert_eq!(out, r.replace_all(&input));
        }
    }
}
