#!/usr/bin/env node
// search__get: return one bundled note from notes/ by file name.
//
// Input (stdin, JSON object):  {"name": "deploy-runbook.md"}   (".md" is optional)
// Output (stdout, JSON object): {"name", "title", "body"}
// Exit codes: 0 ok, 1 unknown note, 2 invalid input (including names with "/" or "..").
'use strict';

const fs = require('fs');
const path = require('path');

const NOTES_DIR = path.join(__dirname, 'notes');

function fail(code, message) {
  process.stderr.write(`get: ${message}\n`);
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

function listNotes() {
  try {
    return fs.readdirSync(NOTES_DIR).filter((f) => f.endsWith('.md')).sort();
  } catch (err) {
    fail(1, `cannot read notes directory: ${err.message}`);
  }
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

  const name = params.name;
  if (typeof name !== 'string' || name === '') {
    fail(2, "parameter 'name' is required and must be a non-empty string");
  }
  if (name.includes('/') || name.includes('\\') || name.includes('..') || name.includes('\0')) {
    fail(2, `invalid note name ${JSON.stringify(name)}: must be a plain file name without "/", "\\" or ".."`);
  }

  const file = name.endsWith('.md') ? name : `${name}.md`;
  const notes = listNotes();
  // Only names that exist in the listing are ever opened; the input is never
  // joined into a path on its own.
  if (!notes.includes(file)) {
    fail(1, `unknown note ${JSON.stringify(name)}. Available notes: ${notes.join(', ')}`);
  }

  const body = fs.readFileSync(path.join(NOTES_DIR, file), 'utf8');
  const m = body.match(/^#\s+(.+)$/m);
  const title = m ? m[1].trim() : file.replace(/\.md$/, '');
  process.stdout.write(JSON.stringify({ name: file, title, body }) + '\n');
}

main().catch((err) => fail(1, err && err.stack ? err.stack : String(err)));
