//! What an upstream sends is bounded before it is parsed: no message may exceed the
//! upstream's `max_result_bytes`, and an answer that does is refused for the call it answers
//! at once, with an error that says so, instead of being buffered (or silently dropped, so
//! that the call waits for its timeout).
//!
//! Over stdio the child's output is read through a [`LineGuard`], which passes each line on
//! as it arrives and, once a line passes the limit, cuts it, reads the rest without keeping
//! it, and hands on an error response for the request the line answered. The request is found
//! by an [`Envelope`] scan of the message's top-level keys as its bytes go by. Over HTTP the
//! SDK's client enforces the limit and [`refusal`] turns its error into the same answer.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use rmcp::model::{ErrorCode, ErrorData, RequestId};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, ReadBuf};

/// What `data.toolgate` says in the error response that replaces an oversized answer.
const TOO_LARGE: &str = "answer_too_large";

/// The error answering request `id` in place of an answer longer than `limit` bytes.
pub(super) fn refusal(limit: usize) -> ErrorData {
    ErrorData::new(
        ErrorCode::INTERNAL_ERROR,
        format!(
            "its answer was larger than {limit} bytes (the upstream's max_result_bytes), so it was refused"
        ),
        Some(json!({"toolgate": TOO_LARGE, "limit": limit})),
    )
}

/// Whether an error the SDK reports is the refusal of an oversized answer.
pub(super) fn is_refusal(e: &ErrorData) -> bool {
    e.data
        .as_ref()
        .and_then(|d| d.get("toolgate"))
        .is_some_and(|t| t == TOO_LARGE)
}

fn refusal_line(id: &RequestId, limit: usize) -> Vec<u8> {
    let message = json!({"jsonrpc": "2.0", "id": id, "error": refusal(limit)});
    let mut line = serde_json::to_vec(&message).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Longest top-level key kept while scanning (`method` and `result` fit).
const MAX_KEY: usize = 16;
/// Longest request id kept while scanning; a longer one is not answered.
const MAX_ID: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum At {
    /// Before a key of the top-level object (at its start or after a comma).
    #[default]
    Key,
    /// Inside a top-level key.
    InKey,
    /// After a top-level key, before its colon.
    Colon,
    /// In a top-level value.
    Value,
}

/// The top-level keys of one JSON-RPC message, read as its bytes go by in constant memory:
/// whether it is an answer (`result` or `error`), whether it is a request or notification
/// (`method`), and its `id`. Escaped key names are not decoded (an upstream that spells `id`
/// with `\u` escapes only loses its own answer, which then ends at the call's timeout).
#[derive(Debug, Default)]
pub(super) struct Envelope {
    depth: u32,
    in_string: bool,
    escaped: bool,
    at: At,
    key: Vec<u8>,
    /// The key whose value is being read.
    value_of: Vec<u8>,
    id: Vec<u8>,
    id_unusable: bool,
    method: bool,
    answer: bool,
}

impl Envelope {
    fn capturing_id(&self) -> bool {
        self.depth == 1 && self.at == At::Value && self.value_of == b"id"
    }

    fn push_id(&mut self, b: u8) {
        if self.id.len() < MAX_ID {
            self.id.push(b);
        } else {
            self.id_unusable = true;
        }
    }

    pub(super) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.in_string {
                if self.depth == 1 && self.at == At::InKey {
                    if (self.escaped || b != b'"') && self.key.len() <= MAX_KEY {
                        self.key.push(b);
                    }
                } else if self.capturing_id() {
                    self.push_id(b);
                }
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 1 && self.at == At::InKey {
                        self.at = At::Colon;
                    }
                }
                continue;
            }
            match b {
                b'"' => {
                    self.in_string = true;
                    if self.depth == 1 && self.at == At::Key {
                        self.at = At::InKey;
                        self.key.clear();
                    } else if self.capturing_id() {
                        self.push_id(b);
                    }
                }
                b'{' | b'[' => {
                    if self.capturing_id() {
                        self.id_unusable = true;
                    }
                    self.depth += 1;
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b':' if self.depth == 1 && self.at == At::Colon => {
                    self.at = At::Value;
                    match self.key.as_slice() {
                        b"method" => self.method = true,
                        b"result" | b"error" => self.answer = true,
                        _ => {}
                    }
                    self.value_of = std::mem::take(&mut self.key);
                }
                b',' if self.depth == 1 => self.at = At::Key,
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ => {
                    if self.capturing_id() {
                        self.push_id(b);
                    }
                }
            }
        }
    }

    /// The id of the request this message answers, if it is an answer with a usable id.
    pub(super) fn answers(&self) -> Option<RequestId> {
        if !self.answer || self.method || self.id_unusable {
            return None;
        }
        match serde_json::from_slice::<Value>(&self.id).ok()? {
            v @ (Value::Number(_) | Value::String(_)) => serde_json::from_value(v).ok(),
            _ => None,
        }
    }
}

/// Reads a stdio upstream's output line by line, each line at most `limit` bytes; see the
/// module documentation.
pub(super) struct LineGuard<R> {
    inner: R,
    limit: usize,
    /// Bytes of the current line already passed on.
    line: usize,
    /// The current line passed the limit: its rest is read and dropped.
    discarding: bool,
    envelope: Envelope,
    /// What is passed on next: input as read, a cut, a refusal.
    out: Vec<u8>,
    taken: usize,
    chunk: Box<[u8]>,
    group: String,
}

impl<R> LineGuard<R> {
    pub(super) fn new(inner: R, limit: usize, group: &str) -> Self {
        Self {
            inner,
            limit,
            line: 0,
            discarding: false,
            envelope: Envelope::default(),
            out: Vec::new(),
            taken: 0,
            chunk: vec![0; 64 * 1024].into_boxed_slice(),
            group: group.to_owned(),
        }
    }

    /// The end of a line that passed the limit: the answer's refusal, if it was an answer.
    fn refuse(&mut self) {
        let envelope = std::mem::take(&mut self.envelope);
        match envelope.answers() {
            Some(id) => {
                tracing::warn!(upstream = %self.group, limit = self.limit, %id, "an upstream answer passed its size limit and was refused");
                self.out.extend(refusal_line(&id, self.limit));
            }
            None => {
                tracing::warn!(upstream = %self.group, limit = self.limit, "an upstream message passed its size limit and was dropped");
            }
        }
    }

    /// Moves one read of input into `out`, cutting and refusing as needed.
    fn process(&mut self, n: usize) {
        let mut i = 0;
        while i < n {
            let rest = &self.chunk[i..n];
            let end = rest.iter().position(|&b| b == b'\n');
            let segment = &rest[..end.unwrap_or(rest.len())];
            let consumed = segment.len() + usize::from(end.is_some());
            if self.discarding {
                self.envelope.feed(segment);
                if end.is_some() {
                    self.discarding = false;
                    self.refuse();
                }
            } else if self.line + segment.len() > self.limit {
                self.envelope.feed(segment);
                // What was passed on of this line ends here: the SDK drops it as unparsable.
                if self.line > 0 {
                    self.out.push(b'\n');
                }
                self.line = 0;
                if end.is_some() {
                    self.refuse();
                } else {
                    self.discarding = true;
                }
            } else {
                self.envelope.feed(segment);
                self.out.extend_from_slice(segment);
                self.line += segment.len();
                if end.is_some() {
                    self.out.push(b'\n');
                    self.line = 0;
                    self.envelope = Envelope::default();
                }
            }
            i += consumed;
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineGuard<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.out.len() {
                let n = (this.out.len() - this.taken).min(buf.remaining());
                buf.put_slice(&this.out[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.out.len() {
                    this.out.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
            this.process(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn scan(text: &str) -> Envelope {
        let mut e = Envelope::default();
        // Fed in small pieces, as reads split it.
        for piece in text.as_bytes().chunks(3) {
            e.feed(piece);
        }
        e
    }

    #[test]
    fn the_envelope_finds_the_id_of_an_answer_wherever_it_is() {
        let id = |t: &str| scan(t).answers().map(|i| i.to_string());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"result":{"id":9,"x":"\"id\":8"}}"#),
            Some("7".into())
        );
        assert_eq!(
            id(r#"{"result":{"content":[{"text":"a,\"b\"}"}]}, "jsonrpc":"2.0" , "id" : "r-1"}"#),
            Some("r-1".into())
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":3,"error":{"code":1}}"#),
            Some("3".into())
        );
        // Requests and notifications from the upstream are not answers to anything.
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#), None);
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#),
            None
        );
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":{"x":1},"result":{}}"#), None);
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":null,"result":{}}"#), None);
    }

    /// What the guard passes on of `input`, read from a pipe in 128-byte pieces.
    async fn through(input: Vec<u8>, limit: usize) -> String {
        use tokio::io::AsyncWriteExt;
        let (mut w, r) = tokio::io::duplex(128);
        tokio::spawn(async move {
            w.write_all(&input).await.unwrap();
        });
        let mut guard = LineGuard::new(r, limit, "g");
        let mut out = Vec::new();
        guard.read_to_end(&mut out).await.unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn an_oversized_answer_is_cut_and_refused_and_the_lines_around_it_pass() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"result\":{{\"text\":\"{}\"}},\"id\":42}}",
            "x".repeat(300_000)
        );
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{}}}}\n{big}\n{{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{{}}}}\n"
        );
        let out = through(input.into_bytes(), 1000).await;
        assert!(
            out.lines().all(|l| l.len() <= 1000),
            "a line passed the limit"
        );
        // What the SDK can parse: the small answers, and the refusal in place of the big one
        // (the start of the big one that went before it was cut, so it does not parse).
        let parsed: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_eq!(parsed.len(), 3, "{out}");
        assert_eq!(parsed[0], json!({"jsonrpc": "2.0", "id": 1, "result": {}}));
        assert_eq!(parsed[1]["id"], 42);
        assert_eq!(parsed[1]["error"]["data"]["toolgate"], TOO_LARGE);
        let said = parsed[1]["error"]["message"].as_str().unwrap();
        assert!(said.contains("larger than 1000 bytes"), "{said}");
        assert_eq!(parsed[2], json!({"jsonrpc": "2.0", "id": 2, "result": {}}));
        // An oversized notification is dropped without a word.
        let note = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{}\"}}}}\n",
            "y".repeat(5000)
        );
        let out = through(note.into_bytes(), 1000).await;
        assert!(
            out.lines()
                .all(|l| serde_json::from_str::<Value>(l).is_err()),
            "{out}"
        );
    }
}
