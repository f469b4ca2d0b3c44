#!/bin/sh
# text__wordcount: count words, lines and characters of the "text" parameter.
#
# Input (stdin, JSON object):  {"text": "hello world\nbye"}
# Output (stdout, JSON object): {"words": 3, "lines": 2, "chars": 15}
#
# Pure POSIX sh + awk + coreutils (no jq, no python). awk decodes the JSON
# string value of "text"; wc/tr count the decoded bytes in the C locale:
#   words = runs of characters separated by ASCII whitespace (space \t \n \v \f \r)
#   lines = number of "\n" characters, plus one if the text is non-empty and
#           does not end with "\n" (so "" -> 0, "a" -> 1, "a\n" -> 1, "a\nb" -> 2)
#   chars = Unicode code points (UTF-8 continuation bytes are not counted;
#           a \uXXXX escape, or a surrogate pair, counts as one character)
# Exit codes: 0 ok, 2 invalid input (bad JSON, missing or non-string "text").

LC_ALL=C
export LC_ALL

# Minimal recursive-descent JSON reader. Prints the decoded value of the
# top-level "text" key to stdout. \uXXXX escapes that are not ASCII are printed
# as the placeholder "x": only the counts matter here, and a single byte keeps
# both the character count and the word boundaries right.
AWK_PROG='
function fail(msg) {
  print "wordcount: " msg | "cat 1>&2"
  close("cat 1>&2")
  failed = 1
  exit 2
}
function peek() { return substr(s, pos, 1) }
function ws(  c) {
  while (pos <= n) {
    c = substr(s, pos, 1)
    if (c != " " && c != "\t" && c != "\n" && c != "\r") break
    pos++
  }
}
function expect(c) {
  if (substr(s, pos, 1) != c) fail("invalid JSON: expected \"" c "\" at byte " pos)
  pos++
}
function hexval(h,  i, v, d) {
  v = 0
  for (i = 1; i <= 4; i++) {
    d = index("0123456789abcdef", tolower(substr(h, i, 1)))
    if (d == 0) fail("invalid JSON: bad \\u escape \"" h "\"")
    v = v * 16 + d - 1
  }
  return v
}
# mode: "key" (return the decoded string), "emit" (print it), "skip".
function str(mode,  c, e, cp, lo, acc) {
  expect("\"")
  acc = ""
  while (1) {
    if (pos > n) fail("invalid JSON: unterminated string")
    c = substr(s, pos, 1)
    if (c == "\"") { pos++; return acc }
    if (c == "\\") {
      e = substr(s, pos + 1, 1)
      pos += 2
      if (e == "\"" || e == "\\" || e == "/") c = e
      else if (e == "n") c = "\n"
      else if (e == "t") c = "\t"
      else if (e == "r") c = "\r"
      else if (e == "f") c = "\f"
      else if (e == "b") c = "\b"
      else if (e == "u") {
        cp = hexval(substr(s, pos, 4))
        pos += 4
        if (cp >= 55296 && cp <= 56319 && substr(s, pos, 2) == "\\u") {
          lo = hexval(substr(s, pos + 2, 4))
          if (lo >= 56320 && lo <= 57343) pos += 6
        }
        if (cp == 9) c = "\t"
        else if (cp == 10) c = "\n"
        else if (cp == 11) c = "\v"
        else if (cp == 12) c = "\f"
        else if (cp == 13) c = "\r"
        else if (cp >= 32 && cp <= 126) c = sprintf("%c", cp)
        else c = "x"
      }
      else fail("invalid JSON: bad escape \"\\" e "\"")
    } else {
      pos++
    }
    if (mode == "emit") printf "%s", c
    else if (mode == "key") acc = acc c
  }
}
function scalar(  start, tok) {
  start = pos
  while (pos <= n && index("+-.0123456789eEtruefalsn", substr(s, pos, 1)) > 0) pos++
  tok = substr(s, start, pos - start)
  if (tok == "") fail("invalid JSON: unexpected \"" peek() "\" at byte " pos)
  if (tok != "true" && tok != "false" && tok != "null" && tok !~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/)
    fail("invalid JSON: bad literal \"" tok "\"")
}
function value(top,  c, key) {
  ws()
  c = peek()
  if (c == "\"") { str("skip"); return }
  if (c == "[") {
    pos++; ws()
    if (peek() == "]") { pos++; return }
    while (1) {
      value(0); ws()
      if (peek() == ",") { pos++; continue }
      expect("]"); return
    }
  }
  if (c == "{") {
    pos++; ws()
    if (peek() == "}") { pos++; return }
    while (1) {
      ws(); key = str("key"); ws(); expect(":"); ws()
      if (top && key == "text") {
        if (peek() != "\"") fail("parameter \"text\" must be a string")
        if (seen) fail("parameter \"text\" given more than once")
        seen = 1
        str("emit")
      } else {
        value(0)
      }
      ws()
      if (peek() == ",") { pos++; continue }
      expect("}"); return
    }
  }
  if (top) fail("input must be a JSON object")
  scalar()
}
{ s = (NR == 1) ? $0 : s "\n" $0 }
END {
  if (failed) exit 2
  n = length(s); pos = 1; seen = 0
  ws()
  if (pos > n) fail("no input: expected a JSON object with a \"text\" string")
  if (peek() != "{") fail("input must be a JSON object")
  value(1)
  ws()
  if (pos <= n) fail("invalid JSON: trailing data at byte " pos)
  if (!seen) fail("missing required parameter \"text\" (a string)")
}
'

input=$(cat) || exit 2
# The trailing "x" keeps command substitution from eating trailing newlines.
decoded=$(printf '%s' "$input" | awk "$AWK_PROG" && printf x) || exit 2
decoded=${decoded%x}

# Map every non-whitespace byte to "x" first: wc -w in the C locale does not
# count words made only of non-ASCII or control bytes.
words=$(printf '%s' "$decoded" | tr -c ' \t\n\v\f\r' '[x*]' | wc -w | tr -d ' \t')
newlines=$(printf '%s' "$decoded" | tr -cd '\n' | wc -c | tr -d ' \t')
chars=$(printf '%s' "$decoded" | tr -d '\200-\277' | wc -c | tr -d ' \t')

lines=$newlines
case $decoded in
  '') ;;
  *'
') ;;
  *) lines=$((newlines + 1)) ;;
esac

printf '{"words": %s, "lines": %s, "chars": %s}\n' "$words" "$lines" "$chars"
