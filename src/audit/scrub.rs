//! Scrubbing redacted values out of what a tool says back (stderr, errors, stored results),
//! in every form a script is likely to write them in.
//!
//! A script rarely prints a secret as it received it: it logs its input with `json.dumps`
//! (`"P\u00e4ss"`), builds a query string (`P%C3%A4ss+w` or `%20`), a `Basic` header (base64
//! of `user:pass`), or prints bytes (`b'P\xc3\xa4ss'`). Listing every encoding of every secret
//! would miss the mixed ones (a `\u` escape inside a URL-encoded JSON body), so the text is
//! *decoded* instead: besides the text itself, it is read through backslash escapes (JSON,
//! Python, JavaScript, C), through URL encoding, and through both in either order, and each
//! secret is searched for in every reading. Each decoded byte remembers the stretch of the
//! original text it came from, so a match replaces exactly the escaped stretch that spelled
//! the secret. Base64 cannot be decoded out of free text (any word is base64), so it goes
//! the other way: the characters base64 would write for the secret's own bytes, at each of the
//! three alignments, in both alphabets, are searched for, and the whole base64 run holding one
//! is replaced.
//!
//! Very short secrets cannot be replaced inside free text (a one-letter password is in every
//! word): see [`MIN_SCRUBBABLE`].

use base64::Engine;

use super::REDACTED;

/// Secrets of fewer characters than this are not replaced: a text in which one appears as a
/// word of its own (not inside a longer word or number), in any reading, is withheld whole. Its
/// base64 (at most four characters, most of them shared with any text) is not searched for.
pub const MIN_SCRUBBABLE: usize = 4;

/// What replaces a text that holds a secret too short to replace.
pub const WITHHELD: &str = "[withheld: it may repeat an argument that is redacted]";

/// A base64 core shorter than this would match innocent text.
const MIN_BASE64: usize = 4;

/// One stretch of a reading: bytes `[at, next.at)` of the reading came from bytes
/// `[from, from + len)` of the text it was read from, byte for byte (`copied`) or as a whole
/// (an escape sequence).
#[derive(Debug, Clone, Copy)]
struct Seg {
    at: usize,
    from: usize,
    len: usize,
    copied: bool,
}

/// A reading of the text: its bytes, and where each came from in its parent reading (none for
/// the text itself).
struct View {
    bytes: Vec<u8>,
    segs: Vec<Seg>,
    parent: Option<usize>,
}

#[derive(Default)]
struct Builder {
    bytes: Vec<u8>,
    segs: Vec<Seg>,
}

impl Builder {
    /// Bytes copied as they are, from `from` on in the parent.
    fn copy(&mut self, from: usize, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match self.segs.last_mut() {
            Some(s) if s.copied && s.from + s.len == from && s.at + s.len == self.bytes.len() => {
                s.len += bytes.len()
            }
            _ => self.segs.push(Seg {
                at: self.bytes.len(),
                from,
                len: bytes.len(),
                copied: true,
            }),
        }
        self.bytes.extend_from_slice(bytes);
    }

    fn decoded(&mut self, from: usize, len: usize, bytes: &[u8]) {
        self.segs.push(Seg {
            at: self.bytes.len(),
            from,
            len,
            copied: false,
        });
        self.bytes.extend_from_slice(bytes);
    }

    fn view(self, parent: usize) -> View {
        View {
            bytes: self.bytes,
            segs: self.segs,
            parent: Some(parent),
        }
    }
}

impl View {
    /// The stretch of the parent reading that bytes `[start, end)` of this one came from.
    fn to_parent(&self, start: usize, end: usize) -> (usize, usize) {
        let seg = |p: usize| {
            let i = self.segs.partition_point(|s| s.at <= p).saturating_sub(1);
            self.segs[i]
        };
        let s = seg(start);
        let e = seg(end - 1);
        let from = if s.copied {
            s.from + (start - s.at)
        } else {
            s.from
        };
        let to = if e.copied {
            e.from + (end - 1 - e.at) + 1
        } else {
            e.from + e.len
        };
        (from, to)
    }
}

fn hex(b: u8) -> Option<u32> {
    (b as char).to_digit(16)
}

fn hex_at(src: &[u8], at: usize, n: usize) -> Option<u32> {
    let digits = src.get(at..at + n)?;
    digits
        .iter()
        .try_fold(0u32, |acc, &b| Some(acc * 16 + hex(b)?))
}

fn utf8(c: u32) -> Option<Vec<u8>> {
    char::from_u32(c).map(|c| c.to_string().into_bytes())
}

/// `src` read through backslash escapes: JSON's (`\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t`,
/// `\uXXXX` with surrogate pairs), Python's and C's (`\'`, `\xHH`, `\UXXXXXXXX`) and
/// JavaScript's `\u{…}`. `\xHH` is a byte in a bytes literal and a code point in a string
/// one; `x_is_code_point` picks which. `None` when there is nothing to read.
fn backslash(src: &[u8], x_is_code_point: bool) -> Option<Builder> {
    if !src.contains(&b'\\') || (x_is_code_point && !src.windows(2).any(|w| w == b"\\x")) {
        return None;
    }
    let mut out = Builder::default();
    let mut i = 0;
    while i < src.len() {
        // Up to the next backslash, as it is.
        let next = memchr::memchr(b'\\', &src[i..]).map_or(src.len(), |n| i + n);
        out.copy(i, &src[i..next]);
        i = next;
        if i + 1 >= src.len() {
            out.copy(i, &src[i..]);
            break;
        }
        let single = match src[i + 1] {
            b'"' | b'\\' | b'/' | b'\'' => Some(src[i + 1]),
            b'b' => Some(0x08),
            b'f' => Some(0x0c),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(b) = single {
            out.decoded(i, 2, &[b]);
            i += 2;
            continue;
        }
        let decoded: Option<(Vec<u8>, usize)> = match src[i + 1] {
            b'x' => hex_at(src, i + 2, 2).and_then(|v| {
                let bytes = if x_is_code_point {
                    utf8(v)?
                } else {
                    vec![v as u8]
                };
                Some((bytes, 4))
            }),
            b'U' => hex_at(src, i + 2, 8).and_then(|v| Some((utf8(v)?, 10))),
            b'u' if src.get(i + 2) == Some(&b'{') => {
                let close = src[i + 3..].iter().take(7).position(|&b| b == b'}');
                close.and_then(|n| {
                    let v = hex_at(src, i + 3, n).filter(|_| n > 0)?;
                    Some((utf8(v)?, n + 4))
                })
            }
            b'u' => hex_at(src, i + 2, 4).and_then(|hi| {
                if (0xD800..0xDC00).contains(&hi) {
                    // A surrogate pair spells one character in two escapes.
                    let lo = (src.get(i + 6..i + 8) == Some(b"\\u"))
                        .then(|| hex_at(src, i + 8, 4))
                        .flatten()
                        .filter(|lo| (0xDC00..0xE000).contains(lo))?;
                    Some((utf8(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?, 12))
                } else {
                    Some((utf8(hi)?, 6))
                }
            }),
            _ => None,
        };
        match decoded {
            Some((bytes, len)) => {
                out.decoded(i, len, &bytes);
                i += len;
            }
            None => {
                out.copy(i, &src[i..i + 1]);
                i += 1;
            }
        }
    }
    Some(out)
}

/// `src` read through URL encoding: `%HH` is a byte, `+` a space (forms write spaces so).
fn url(src: &[u8]) -> Option<Builder> {
    if !src.iter().any(|&b| b == b'%' || b == b'+') {
        return None;
    }
    let mut out = Builder::default();
    let mut i = 0;
    while i < src.len() {
        let next = memchr::memchr2(b'%', b'+', &src[i..]).map_or(src.len(), |n| i + n);
        out.copy(i, &src[i..next]);
        i = next;
        if i == src.len() {
            break;
        }
        if src[i] == b'+' {
            out.decoded(i, 1, b" ");
            i += 1;
        } else if let Some(v) = hex_at(src, i + 1, 2) {
            out.decoded(i, 3, &[v as u8]);
            i += 3;
        } else {
            out.copy(i, &src[i..i + 1]);
            i += 1;
        }
    }
    Some(out)
}

/// The text and its readings: through backslash escapes (bytes and code points), URL
/// encoding, and two levels of either (a JSON string holding JSON, a URL-encoded JSON body,
/// JSON holding a query string).
fn readings(text: &str) -> Vec<View> {
    type Reader = fn(&[u8]) -> Option<Builder>;
    let readers: [Reader; 3] = [|s| backslash(s, false), |s| backslash(s, true), url];
    let mut views = vec![View {
        bytes: text.as_bytes().to_vec(),
        segs: Vec::new(),
        parent: None,
    }];
    let mut level = vec![0];
    for _ in 0..2 {
        let mut next = Vec::new();
        for &parent in &level {
            for read in readers {
                if let Some(b) = read(&views[parent].bytes) {
                    views.push(b.view(parent));
                    next.push(views.len() - 1);
                }
            }
        }
        level = next;
    }
    views
}

/// The stretch of the text that bytes `[start, end)` of reading `view` came from.
fn to_text(views: &[View], mut view: usize, mut start: usize, mut end: usize) -> (usize, usize) {
    while let Some(parent) = views[view].parent {
        (start, end) = views[view].to_parent(start, end);
        view = parent;
    }
    (start, end)
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b >= 0x80
}

fn is_base64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_' | b'=')
}

/// The characters base64 writes for `secret`'s own bytes (those no neighbouring byte changes),
/// after 0, 1 and 2 bytes of anything, in the standard and URL-safe alphabets.
fn base64_cores(secret: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..3usize {
        let mut buf = vec![0u8; k];
        buf.extend_from_slice(secret);
        let enc = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&buf);
        let first = (4 * k).div_ceil(3);
        let end = (8 * (k + secret.len())) / 6;
        if end < first + MIN_BASE64 {
            continue;
        }
        let core = &enc[first..end];
        out.push(core.to_owned());
        let url_safe = core.replace('+', "-").replace('/', "_");
        if url_safe != core {
            out.push(url_safe);
        }
    }
    out
}

/// Where `finder`'s needle starts in `hay`, overlapping occurrences included (`abab` twice in
/// `ababab`: replacing only the first would leave part of the second).
fn overlapping<'a>(
    finder: &'a memchr::memmem::Finder<'a>,
    hay: &'a [u8],
) -> impl Iterator<Item = usize> + 'a {
    let mut from = 0;
    std::iter::from_fn(move || {
        let at = from + finder.find(hay.get(from..)?)?;
        from = at + 1;
        Some(at)
    })
}

/// What a searched-for string is.
#[derive(Clone, Copy)]
enum Needle {
    /// A secret, as it is.
    Secret,
    /// A secret too short to replace ([`MIN_SCRUBBABLE`]).
    Short,
    /// What base64 writes for a secret's own bytes.
    Base64,
}

/// `text` (a tool's stderr, an error, a stored result) with every one of `secrets` replaced
/// by `[REDACTED]`, however it was escaped or encoded (see the module's comment); withheld
/// whole when it holds a secret too short to replace.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    if secrets.is_empty() || text.is_empty() {
        return text.to_owned();
    }
    // Every secret, and the base64 of each long enough.
    let mut needles: Vec<(Vec<u8>, Needle)> = Vec::new();
    for secret in &secrets {
        if secret.chars().count() < MIN_SCRUBBABLE {
            needles.push((secret.as_bytes().to_vec(), Needle::Short));
            continue;
        }
        needles.push((secret.as_bytes().to_vec(), Needle::Secret));
        for core in base64_cores(secret.as_bytes()) {
            needles.push((core.into_bytes(), Needle::Base64));
        }
    }
    let views = readings(text);
    let mut hits: Vec<(usize, usize)> = Vec::new();
    for (needle, kind) in &needles {
        let finder = memchr::memmem::Finder::new(needle);
        for (v, view) in views.iter().enumerate() {
            let bytes = &view.bytes;
            for at in overlapping(&finder, bytes) {
                let end = at + needle.len();
                match kind {
                    Needle::Secret => hits.push(to_text(&views, v, at, end)),
                    Needle::Short => {
                        let alone = (at == 0 || !is_word(bytes[at - 1]))
                            && (end == bytes.len() || !is_word(bytes[end]));
                        if alone {
                            return WITHHELD.to_owned();
                        }
                    }
                    Needle::Base64 => {
                        // The whole run: the encoded neighbours (a user name before a
                        // password) go with it, and so do the few bits of the secret they
                        // carry.
                        let mut start = at;
                        while start > 0 && is_base64(bytes[start - 1]) {
                            start -= 1;
                        }
                        let mut end = end;
                        while end < bytes.len() && is_base64(bytes[end]) {
                            end += 1;
                        }
                        hits.push(to_text(&views, v, start, end));
                    }
                }
            }
        }
    }
    if hits.is_empty() {
        return text.to_owned();
    }
    hits.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for (mut start, end) in hits {
        // A stretch always starts and ends on a character of the text (escapes are ASCII, and
        // a secret is whole characters); widened to one anyway, so that slicing cannot fail.
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = end.min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        if start < done {
            // Overlaps the stretch just replaced: one replacement covers both.
            done = done.max(end);
            continue;
        }
        out.push_str(&text[done..start]);
        out.push_str(REDACTED);
        done = end;
    }
    out.push_str(&text[done..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_escaped_form_is_replaced() {
        let s = secrets(&["Päss wörd/+x"]);
        for (text, want) in [
            ("raw Päss wörd/+x end", "raw [REDACTED] end"),
            (
                r#"{"p": "P\u00e4ss w\u00f6rd/+x"}"#,
                r#"{"p": "[REDACTED]"}"#,
            ),
            (
                r#"{"p": "P\u00E4ss w\u00F6rd\/+x"}"#,
                r#"{"p": "[REDACTED]"}"#,
            ),
            ("q=P%C3%A4ss+w%C3%B6rd%2F%2Bx&r=1", "q=[REDACTED]&r=1"),
            ("q=P%c3%a4ss%20w%c3%b6rd/%2bx", "q=[REDACTED]"),
            (r"b'P\xc3\xa4ss w\xc3\xb6rd/+x'", "b'[REDACTED]'"),
            (r"'P\xe4ss w\xf6rd/+x'", "'[REDACTED]'"),
            (r"P\u{e4}ss w\u{f6}rd/+x", "[REDACTED]"),
            // JSON inside JSON, and a URL-encoded JSON body.
            (
                r#""{\"p\": \"P\\u00e4ss w\\u00f6rd/+x\"}""#,
                r#""{\"p\": \"[REDACTED]\"}""#,
            ),
            ("%22P%5Cu00e4ss%20w%5Cu00f6rd%2F%2Bx%22", "%22[REDACTED]%22"),
        ] {
            assert_eq!(scrub(text, &s), want, "{text}");
        }
    }

    #[test]
    fn base64_at_every_alignment_and_in_both_alphabets() {
        let secret = "Päss wörd~~>>??";
        let s = secrets(&[secret]);
        let b64 = base64::engine::general_purpose::STANDARD;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        for prefix in ["", "a", "ab", "user:", "admin:"] {
            for suffix in ["", "!", "!!", "\n"] {
                let plain = format!("{prefix}{secret}{suffix}");
                for enc in [b64.encode(&plain), url.encode(&plain)] {
                    let text = format!("Authorization: Basic {enc} (sent)");
                    assert_eq!(
                        scrub(&text, &s),
                        "Authorization: Basic [REDACTED] (sent)",
                        "{plain:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_secret_withholds_the_text_only_where_it_stands_alone() {
        let s = secrets(&["7f"]);
        assert_eq!(scrub("pin is 7f, retry", &s), WITHHELD);
        assert_eq!(scrub("pin=%37f", &s), WITHHELD);
        assert_eq!(scrub(r#"{"pin":"\u0037f"}"#, &s), WITHHELD);
        // Inside a longer word or number it is not the secret standing there.
        assert_eq!(scrub("hash 17fa0c", &s), "hash 17fa0c");
        assert_eq!(scrub("nothing here", &s), "nothing here");
    }

    #[test]
    fn text_without_a_secret_is_left_as_it_is() {
        let s = secrets(&["hunter2-horse"]);
        for text in [
            "",
            "plain",
            r"a \ at the end \",
            r"broken \u12 and \uD800 alone and \x",
            "100% + 50%zz",
            "naïve ünïcode ✓",
        ] {
            assert_eq!(scrub(text, &s), text);
        }
        assert_eq!(scrub("x", &[]), "x");
    }

    #[test]
    fn overlapping_and_adjacent_matches_give_clean_text() {
        let s = secrets(&["abcdabcd", "cdab", "Zörro"]);
        assert_eq!(scrub("xxabcdabcdabcdyy", &s), "xx[REDACTED]yy");
        assert_eq!(scrub("Zörro,Zörro", &s), "[REDACTED],[REDACTED]");
        assert_eq!(scrub(r"Z\u00f6rroZörro", &s), "[REDACTED][REDACTED]");
    }

    /// What scrubbing costs on the largest texts it is given: a full stderr tail (64 KiB) and a
    /// stored result at the stdout cap (4 MiB), JSON with escapes throughout. A measurement:
    /// `cargo nextest run --release --run-ignored only -E 'test(scrub_cost)' --no-capture`.
    #[test]
    #[ignore = "a measurement; run on demand"]
    fn scrub_cost() {
        let secrets = secrets(&["Päss wörd/+?&=ü~~>>?? 7f", "hunter2-horse"]);
        let line = r#"{"k": "välue "quoted" 50%+ a\b", "n": 12345}"#;
        for size in [64 * 1024, 4 * 1024 * 1024] {
            let text: String = line.repeat(size / line.len());
            let t = std::time::Instant::now();
            let n = 5;
            for _ in 0..n {
                std::hint::black_box(scrub(std::hint::black_box(&text), &secrets));
            }
            println!(
                "{} KiB: {:.2} ms per scrub ({} readings)",
                text.len() / 1024,
                t.elapsed().as_secs_f64() * 1e3 / n as f64,
                readings(&text).len()
            );
        }
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        /// Text full of the characters the readings act on.
        fn noisy() -> impl Strategy<Value = String> {
            "[\\\\%+uxU{}0-9a-fA-F\"' äö/=_-]{0,60}"
        }

        fn encode(secret: &str, how: u8, prefix: &str) -> String {
            let b64 = base64::engine::general_purpose::STANDARD;
            match how {
                0 => secret.to_owned(),
                1 => serde_json::to_string(secret).unwrap(),
                2 => secret
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() {
                            c.to_string()
                        } else {
                            format!("\\u{:04x}", c as u32)
                        }
                    })
                    .collect(),
                3 => url::form_urlencoded::byte_serialize(secret.as_bytes()).collect(),
                4 => secret.bytes().map(|b| format!("%{b:02X}")).collect(),
                _ => b64.encode(format!("{prefix}{secret}")),
            }
        }

        proptest! {
            /// Any text, any secrets: no panic, and no secret of scrubbable length left raw.
            #[test]
            fn scrubbing_never_fails_and_leaves_no_raw_secret(
                text in noisy(),
                secrets in proptest::collection::vec("[a-fäö%\\\\+ ]{1,8}", 0..4),
            ) {
                let out = scrub(&text, &secrets);
                if out != WITHHELD {
                    for s in secrets.iter().filter(|s| s.chars().count() >= MIN_SCRUBBABLE) {
                        prop_assert!(!out.contains(s.as_str()), "{s:?} left in {out:?}");
                    }
                }
            }

            /// A secret written in any of the encodings, between any texts, is gone.
            #[test]
            fn an_encoded_secret_between_any_texts_is_gone(
                before in noisy(),
                after in noisy(),
                secret in "[a-zäö0-9 /+?&=~>]{6,16}",
                how in 0u8..6,
                prefix in "[a-z:]{0,3}",
            ) {
                let written = encode(&secret, how, &prefix);
                let text = format!("{before} {written} {after}");
                let out = scrub(&text, std::slice::from_ref(&secret));
                prop_assert!(!out.contains(&written), "{written:?} left in {out:?}");
                prop_assert!(!out.contains(&secret), "{secret:?} left in {out:?}");
            }
        }
    }
}
