// Runs the reference dsh-session package on cases read as JSON from stdin
// and writes the results as JSON to stdout. Used by the differential tests
// and benchmarks; DSH_REFERENCE_DIR names the npm install folder.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { foldedState } from "./session-state.mjs";

const dir = process.env.DSH_REFERENCE_DIR;
const ref = await import(pathToFileURL(join(dir, "node_modules/@deepseek-ai/dsh-session/lib/index.js")).href);
const { Session, decodeStorageRecord, packChunkRuns } = ref;

function stateOf(session) {
  return { accepted: true, events: session.events.length, ...foldedState(session) };
}

function refused(error) {
  return { accepted: false, message: String(error && error.message) };
}

const ops = {
  // A seed of events, validated as Session.create does (snapshot mode).
  seed({ id, events }) {
    try { return stateOf(Session.create(id, events)); } catch (e) { return refused(e); }
  },
  // Appends one by one; records which appends were refused.
  append({ id, appends }) {
    const session = Session.create(id);
    const outcomes = [];
    for (const a of appends) {
      try {
        const opts = {};
        if (a.surfaceOp !== undefined) opts.surfaceOp = a.surfaceOp;
        if (a.sourceEventSeqs !== undefined) opts.sourceEventSeqs = a.sourceEventSeqs;
        session.append(a.type, a.data, opts);
        outcomes.push(true);
      } catch (e) { outcomes.push(false); }
    }
    return { outcomes, ...stateOf(session) };
  },
  // A stored log as the resume path restores it: the header line (without
  // its `type`) and the storage lines after it (already parsed; packed rows
  // decoded here), or the refusal. `stored` counts the decoded events;
  // `appended` names the types restore adds after them (its end-seed marker).
  restore({ header, records }) {
    try {
      const { type, ...fields } = header;
      const events = records.flatMap((r) => decodeStorageRecord(r));
      const session = Session.fromRestore(fields.id, events, fields);
      const appended = session.events.slice(events.length).map((event) => event.type);
      return { ...stateOf(session), stored: events.length, appended };
    } catch (e) { return refused(e); }
  },
  // Storage records of one batch.
  pack({ events }) { return packChunkRuns(events); },
  // Decode storage lines (already parsed) into events, or the refusal.
  decode({ records }) {
    try { return { ok: true, events: records.flatMap((r) => decodeStorageRecord(r)) }; }
    catch (e) { return { ok: false, message: String(e.message) }; }
  },
  // Benchmark: parse each line, decode rows, restore, derive; the files are
  // read once, then processed `repeat` times. Logs the reference refuses
  // are reported and left out.
  restoreFiles({ paths, repeat }) {
    const texts = paths.map((p) => readFileSync(p, "utf8"));
    const usable = [];
    const refused = [];
    texts.forEach((text, i) => { try { restoreOne(text); usable.push(text); } catch { refused.push(paths[i]); } });
    let events = 0;
    const start = performance.now();
    for (let r = 0; r < repeat; r++) for (const text of usable) events += restoreOne(text);
    return { events, seconds: (performance.now() - start) / 1000, refused };
  },
};

function restoreOne(text) {
  const lines = text.split("\n");
  const header = JSON.parse(lines[0]);
  delete header.type;
  const seed = [];
  for (let i = 1; i < lines.length; i++) if (lines[i]) seed.push(...decodeStorageRecord(JSON.parse(lines[i])));
  const session = Session.fromRestore(header.id, seed, header);
  session.deriveMessages();
  return seed.length;
}

const input = JSON.parse(readFileSync(0, "utf8"));
const results = input.cases.map((c) => ops[input.op](c));
process.stdout.write(JSON.stringify(results));
