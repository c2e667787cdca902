// Runs the reference dsh-session package on cases read as JSON from stdin
// and writes the results as JSON to stdout. Used by the differential tests
// and benchmarks; DSH_REFERENCE_DIR names the npm install folder.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const dir = process.env.DSH_REFERENCE_DIR;
const ref = await import(pathToFileURL(join(dir, "node_modules/@deepseek-ai/dsh-session/lib/index.js")).href);
const { Session, decodeStorageRecord, packChunkRuns } = ref;

function stateOf(session) {
  return {
    accepted: true,
    events: session.events.length,
    surfaceNodes: [...session.surface.nodes],
    replaceGeneration: session.surface.replaceGeneration,
    derivedMessages: session.deriveMessages(),
    requestHeader: session.requestHeader() ?? null,
    requestContext: session.requestContext() ?? null,
  };
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
  // Storage records of one batch.
  pack({ events }) { return packChunkRuns(events); },
  // Decode storage lines (already parsed) into events, or the refusal.
  decode({ records }) {
    try { return { ok: true, events: records.flatMap((r) => decodeStorageRecord(r)) }; }
    catch (e) { return { ok: false, message: String(e.message) }; }
  },
  // Benchmark: parse lines, decode rows, restore, derive; returns event count.
  restoreFiles({ files }) {
    let events = 0;
    for (const { id, text } of files) {
      const lines = text.split("\n");
      const header = JSON.parse(lines[0]);
      delete header.type;
      const seed = [];
      for (let i = 1; i < lines.length; i++) if (lines[i]) seed.push(...decodeStorageRecord(JSON.parse(lines[i])));
      const session = Session.fromRestore(id, seed, header);
      session.deriveMessages();
      events += seed.length;
    }
    return events;
  },
};

const input = JSON.parse(readFileSync(0, "utf8"));
const results = input.cases.map((c) => ops[input.op](c));
process.stdout.write(JSON.stringify(results));
