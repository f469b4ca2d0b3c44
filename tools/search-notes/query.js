#!/usr/bin/env node
// search__query: rank the bundled markdown notes in notes/ by term frequency.
//
// Input (stdin, JSON object):  {"q": "deploy rollback", "limit": 5}
// Output (stdout, JSON object): {"results": [{"note", "title", "score", "snippet"}]}
// Exit codes: 0 ok (possibly zero results), 1 cannot read notes, 2 invalid input.
'use strict';

const fs = require('fs');
const path = require('path');

const NOTES_DIR = path.join(__dirname, 'notes');
const DEFAULT_LIMIT = 5;
const MAX_LIMIT = 20;
const TITLE_WEIGHT = 3; // a term in the title counts this many times
const SNIPPET_MAX = 160;

function fail(code, message) {
  process.stderr.write(`query: ${message}\n`);
  process.exit(code);
}

function readStdin() {
  return new Promise((resolve, reject) => {
    const chunks = [];
    process.stdin.on('data', (c) => chunks.push(c));
    process.stdin.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    process.stdin.on('error', reject);
  });
}

// Lowercase word tokens with light plural folding ("deploys" -> "deploy").
function normalize(token) {
  let t = token.toLowerCase();
  if (t.length > 3 && t.endsWith('s') && !t.endsWith('ss')) t = t.slice(0, -1);
  return t;
}

function tokenize(text) {
  return (text.match(/[\p{L}\p{N}]+/gu) || []).map(normalize);
}

function titleOf(name, body) {
  const m = body.match(/^#\s+(.+)$/m);
  return m ? m[1].trim() : name.replace(/\.md$/, '');
}

function stripMarkdown(line) {
  return line
    .replace(/^\s*(#+|[-*]\s+\[[ xX]\]|[-*]|\d+\.)\s*/, '')
    .replace(/[`*_]/g, '')
    .trim();
}

// Pick the body line that contains the most distinct query terms and
// trim it to SNIPPET_MAX characters around the first hit.
function snippetFor(body, terms) {
  let best = null;
  let bestHits = 0;
  for (const raw of body.split('\n')) {
    if (/^\s*#/.test(raw)) continue; // headings are shown as the title
    const line = stripMarkdown(raw);
    if (!line) continue;
    const tokens = new Set(tokenize(line));
    let hits = 0;
    for (const t of terms) if (tokens.has(t)) hits += 1;
    if (hits > bestHits) {
      best = line;
      bestHits = hits;
    }
  }
  if (best === null) {
    best = body.split('\n').map(stripMarkdown).find((l) => l && !/^#/.test(l)) || '';
  }
  if (best.length <= SNIPPET_MAX) return best;
  // Center the window on the first matching word.
  const lower = best.toLowerCase();
  let first = -1;
  for (const t of terms) {
    const i = lower.indexOf(t);
    if (i !== -1 && (first === -1 || i < first)) first = i;
  }
  const start = Math.max(0, Math.min(first - 40, best.length - SNIPPET_MAX));
  const end = start + SNIPPET_MAX;
  return (start > 0 ? '…' : '') + best.slice(start, end).trim() + (end < best.length ? '…' : '');
}

async function main() {
  const raw = (await readStdin()).trim();
  let params = {};
  if (raw) {
    try {
      params = JSON.parse(raw);
    } catch (err) {
      fail(2, `input is not valid JSON: ${err.message}`);
    }
  }
  if (params === null || typeof params !== 'object' || Array.isArray(params)) {
    fail(2, 'input must be a JSON object');
  }

  const q = params.q;
  if (typeof q !== 'string' || q.trim() === '') {
    fail(2, "parameter 'q' is required and must be a non-empty string");
  }
  let limit = params.limit === undefined || params.limit === null ? DEFAULT_LIMIT : params.limit;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    fail(2, `parameter 'limit' must be an integer between 1 and ${MAX_LIMIT}`);
  }

  const terms = [...new Set(tokenize(q))];
  if (terms.length === 0) {
    process.stdout.write(JSON.stringify({ results: [] }) + '\n');
    return;
  }

  let files;
  try {
    files = fs.readdirSync(NOTES_DIR).filter((f) => f.endsWith('.md')).sort();
  } catch (err) {
    fail(1, `cannot read notes directory: ${err.message}`);
  }

  const results = [];
  for (const file of files) {
    const body = fs.readFileSync(path.join(NOTES_DIR, file), 'utf8');
    const title = titleOf(file, body);
    const counts = new Map();
    for (const t of tokenize(body)) counts.set(t, (counts.get(t) || 0) + 1);
    const titleTokens = tokenize(title);
    let score = 0;
    for (const term of terms) {
      score += counts.get(term) || 0;
      // The title line is already counted once as part of the body.
      score += (TITLE_WEIGHT - 1) * titleTokens.filter((t) => t === term).length;
    }
    if (score > 0) {
      results.push({ note: file, title, score, snippet: snippetFor(body, terms) });
    }
  }

  results.sort((a, b) => b.score - a.score || a.note.localeCompare(b.note));
  process.stdout.write(JSON.stringify({ results: results.slice(0, limit) }) + '\n');
}

main().catch((err) => fail(1, err && err.stack ? err.stack : String(err)));
