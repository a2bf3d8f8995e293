//! Redis's glob patterns (KEYS, SCAN MATCH, CONFIG GET), matched as Redis's
//! `stringmatchlen` matches them:
//!
//! - `*` any run of bytes, `?` any one byte;
//! - `[abc]`, `[^abc]`, `[a-z]` (a reversed range `[z-a]` is the same range), `\`
//!   inside brackets quotes the next byte; an unclosed `[` takes the rest of the
//!   pattern as its set;
//! - `\x` outside brackets is the byte `x`; a `\` at the end is itself;
//! - everything else matches itself, byte for byte.
//!
//! The pattern is compiled into tokens once and matched with the classic
//! backtrack-to-the-last-star walk, so matching costs O(pattern × subject) whatever
//! the pattern (Redis bounds its recursion instead).

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Star,
    AnyByte,
    Byte(u8),
    Set { negated: bool, items: Vec<SetItem> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetItem {
    Byte(u8),
    Range(u8, u8),
}

impl Token {
    /// Whether this single-byte token matches `byte` (never called for `Star`).
    fn matches(&self, byte: u8) -> bool {
        match self {
            Token::Star | Token::AnyByte => true,
            Token::Byte(b) => *b == byte,
            Token::Set { negated, items } => {
                let hit = items.iter().any(|item| match *item {
                    SetItem::Byte(b) => b == byte,
                    SetItem::Range(low, high) => (low..=high).contains(&byte),
                });
                hit != *negated
            }
        }
    }
}

/// A compiled glob pattern.
#[derive(Clone, Debug)]
pub(crate) struct Glob {
    tokens: Vec<Token>,
}

impl Glob {
    pub(crate) fn new(pattern: &[u8]) -> Glob {
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < pattern.len() {
            let rest = &pattern[i..];
            let (token, used) = match rest[0] {
                b'*' => (Token::Star, 1),
                b'?' => (Token::AnyByte, 1),
                b'[' => compile_set(&rest[1..]),
                b'\\' if rest.len() >= 2 => (Token::Byte(rest[1]), 2),
                byte => (Token::Byte(byte), 1),
            };
            // Consecutive stars match what one star matches.
            if !(token == Token::Star && tokens.last() == Some(&Token::Star)) {
                tokens.push(token);
            }
            i += used;
        }
        Glob { tokens }
    }

    /// Whether the pattern is `*` alone (SCAN skips matching then).
    pub(crate) fn matches_everything(&self) -> bool {
        self.tokens == [Token::Star]
    }

    pub(crate) fn matches(&self, subject: &[u8]) -> bool {
        let tokens = &self.tokens;
        let (mut t, mut s) = (0, 0);
        // The last star seen, and where in the subject its run currently ends.
        let mut star: Option<(usize, usize)> = None;
        while s < subject.len() {
            match tokens.get(t) {
                Some(Token::Star) => {
                    star = Some((t, s));
                    t += 1;
                    continue;
                }
                Some(token) if token.matches(subject[s]) => {
                    t += 1;
                    s += 1;
                    continue;
                }
                _ => {}
            }
            let Some((star_t, star_s)) = star else {
                return false;
            };
            // Let the star take one more byte and retry the tokens after it.
            star = Some((star_t, star_s + 1));
            t = star_t + 1;
            s = star_s + 1;
        }
        tokens[t..].iter().all(|token| *token == Token::Star)
    }
}

/// Compiles the set after a `[`; returns it and the bytes used, the `[` included.
fn compile_set(body: &[u8]) -> (Token, usize) {
    let negated = body.first() == Some(&b'^');
    let mut i = usize::from(negated);
    let mut items = Vec::new();
    loop {
        let rest = &body[i.min(body.len())..];
        match rest {
            [b'\\', quoted, ..] => {
                items.push(SetItem::Byte(*quoted));
                i += 2;
            }
            [b']', ..] => {
                i += 1;
                break;
            }
            [] => break,
            [low, b'-', high, ..] => {
                items.push(SetItem::Range(*low.min(high), *low.max(high)));
                i += 3;
            }
            [byte, ..] => {
                items.push(SetItem::Byte(*byte));
                i += 1;
            }
        }
    }
    (Token::Set { negated, items }, 1 + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, subject: &str) -> bool {
        Glob::new(pattern.as_bytes()).matches(subject.as_bytes())
    }

    #[test]
    fn stars_and_questions() {
        assert!(m("*", ""));
        assert!(m("*", "anything"));
        assert!(m("h?llo", "hello"));
        assert!(!m("h?llo", "hllo"));
        assert!(m("h*llo", "hllo"));
        assert!(m("h*llo", "heeeello"));
        assert!(m("*a*b*", "xxaxxbxx"));
        assert!(!m("*a*b*", "xxbxxaxx"));
        assert!(m("a**", "a"));
        assert!(!m("a", "ab"));
        assert!(!m("ab", "a"));
        assert!(m("", ""));
        assert!(!m("", "a"));
    }

    #[test]
    fn sets() {
        assert!(m("h[ae]llo", "hello"));
        assert!(m("h[ae]llo", "hallo"));
        assert!(!m("h[ae]llo", "hillo"));
        assert!(m("h[^e]llo", "hallo"));
        assert!(!m("h[^e]llo", "hello"));
        assert!(m("h[a-b]llo", "hbllo"));
        assert!(m("h[b-a]llo", "hallo"));
        assert!(!m("h[a-b]llo", "hcllo"));
        assert!(m("[\\]]", "]"));
        assert!(!m("[]", "a"));
        assert!(m("[^]", "a"));
        // An unclosed set takes the rest of the pattern.
        assert!(m("a[bc", "ab"));
        assert!(m("a[bc", "ac"));
        assert!(!m("a[bc", "abc"));
        // Redis reads `a-]` as a range from `a` to `]` (which reverses to `]-a`).
        assert!(m("[a-]", "^"));
    }

    #[test]
    fn escapes() {
        assert!(m("h\\*llo", "h*llo"));
        assert!(!m("h\\*llo", "hello"));
        assert!(m("a\\", "a\\"));
        assert!(m("\\?", "?"));
    }

    #[test]
    fn binary() {
        let glob = Glob::new(b"\xff*\x00");
        assert!(glob.matches(b"\xff\x01\x02\x00"));
        assert!(!glob.matches(b"\xfe\x00"));
    }

    #[test]
    fn pathological_patterns_stay_fast() {
        let pattern = "a*".repeat(200) + "b";
        let subject = "a".repeat(10_000);
        assert!(!m(&pattern, &subject));
    }

    #[test]
    fn everything() {
        assert!(Glob::new(b"*").matches_everything());
        assert!(Glob::new(b"**").matches_everything());
        assert!(!Glob::new(b"a*").matches_everything());
    }
}
